"""A DAPO policy update through verl's own Megatron engine path, with this plugin's engine.

``torchrun --nproc-per-node 2 -m mcore_dapo_checks.verl_engine --hf-path DIR --work W --ep 2``

Every rank composes verl's ``ppo_trainer`` config with Hydra from the user's overrides
(``actor_rollout_ref.actor.strategy=megatron`` and the Megatron sizes), builds verl's
``ActorRolloutRefWorker(role="actor")`` and calls what verl's trainer calls:
``init_model`` (``EngineRegistry`` -> this plugin's ``McoreDapoEngine``),
``compute_log_prob`` (the old policy, ``infer_batch``) and ``update_actor``
(``train_mini_batch`` -> ``MegatronEngine.forward_backward_batch`` with verl's
``ppo_loss``, then Megatron's optimizer). The batch is the one of
:mod:`mcore_dapo_checks.verl_dapo` (verl's ``dapo`` reward manager, GRPO advantages),
padded left/right as verl's rollout leaves it and converted with verl's
``left_right_2_no_padding``. After the update the weights go to an HF model through the
engine's ``get_per_tensor_param``; ``verl_dapo reference`` repeats the update in one process.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from mcore_dapo.bridge.layout import Layout
from mcore_dapo.io.hf_reader import INDEX
from mcore_dapo_checks.verl_dapo import (CLIP, GROUPS, LR, N, PROMPT, RESPONSE, hf_model, make_batch)

MICRO = 2


def overrides(hf_path: str, ep: int, tp: int = 1, pp: int = 1, *, world: int = 2, device: str = "cpu",
              remove_padding: bool = False, router_replay: str = "disabled", dispatcher: str = "alltoall",
              offload: bool = False, dist_optimizer: bool = False) -> list[str]:
    """What a user writes (the guide's DAPO settings, tiny sizes), strategy=megatron included;
    ``remove_padding``: packed sequences (THD), where the device's attention supports them;
    ``offload``: verl's param (with its gradient buffers) and optimizer offload, as the launch scripts set."""
    a = "actor_rollout_ref.actor"
    extra = [f"{a}.megatron.router_replay.mode={router_replay}"] if router_replay != "disabled" else []
    if dispatcher != "alltoall":
        extra.append(f"+{a}.megatron.override_transformer_config.moe_token_dispatcher_type={dispatcher}")
    return [*extra,
        f"{a}.strategy=megatron",
        f"actor_rollout_ref.model.path={hf_path}",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        *Layout(tp=tp, pp=pp, ep=ep, etp=1).hydra_overrides(f"{a}.megatron"),
        f"{a}.megatron.use_distributed_optimizer={dist_optimizer}",
        f"{a}.megatron.param_offload={offload}",
        f"{a}.megatron.optimizer_offload={offload}",
        f"{a}.clip_ratio_low=0.2",
        f"{a}.clip_ratio_high=0.28",
        f"{a}.clip_ratio_c=10.0",
        f"{a}.loss_agg_mode=token-mean",
        f"{a}.ppo_mini_batch_size={GROUPS}",
        f"{a}.ppo_micro_batch_size_per_gpu={MICRO}",
        f"{a}.ppo_epochs=1",
        f"{a}.shuffle=False",
        f"{a}.use_kl_loss=False",
        f"{a}.entropy_coeff=0",
        f"{a}.optim.lr={LR}",
        f"{a}.optim.weight_decay=0.1",
        f"{a}.optim.clip_grad={CLIP}",
        f"{a}.optim.total_training_steps=4",
        "actor_rollout_ref.rollout.n=%d" % N,
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"trainer.n_gpus_per_node={world}",
        "trainer.nnodes=1",
        f"trainer.device={device}",
    ]


def rollout_batch(batch: dict):
    """The batch as verl's rollout leaves it: a DataProto, prompts left- and responses right-padded."""
    from verl import DataProto

    tokens = batch["tokens"]
    mask = batch["response_mask"].long()  # novermin: Tensor.long, not Python 2's long
    attention = torch.cat([torch.ones(tokens.shape[0], PROMPT, dtype=torch.long), mask], 1)
    position = (torch.cumsum(attention, 1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={
        "prompts": tokens[:, :PROMPT], "responses": tokens[:, PROMPT:], "input_ids": tokens,
        "attention_mask": attention, "position_ids": position, "response_mask": mask,
        "advantages": batch["advantages"]})


def engine_batch(data, old_log_probs=None):
    """What verl's trainer sends its workers: ``to_tensordict`` then ``left_right_2_no_padding``."""
    from verl.workers.utils.padding import left_right_2_no_padding

    if old_log_probs is not None:
        data = data.union(type(data).from_dict(tensors={"old_log_probs": old_log_probs}))
    data.meta_info["temperature"] = 1.0
    return left_right_2_no_padding(data.to_tensordict())


def dispatch(td, dp: int, dp_rank: int):
    """This rank's part of the batch, as verl's ``make_nd_compute_dataproto_dispatch_fn`` sends it."""
    from verl.protocol import BatchData

    return BatchData(td).chunk(chunks=dp)[dp_rank].unlock_()


def dist_world() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def start_actor(a, **kw):
    """verl's ``ActorRolloutRefWorker(role="actor")`` built from the user's overrides (``kw``: layout, device,
    replay...) and ``init_model`` run (this plugin's engine); the batch and its rollout-shaped DataProto."""
    from transformers import AutoConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from mcore_dapo.verl_plugin.main_dapo import compose
    from mcore_dapo.verl_plugin.overrides import rewrite

    c = compose(rewrite(overrides(a.hf_path, a.ep, world=dist_world(), **kw)))
    worker = ActorRolloutRefWorker(c.actor_rollout_ref, role="actor")
    worker.init_model()
    batch = make_batch(AutoConfig.from_pretrained(a.hf_path).vocab_size, seed=a.seed)
    return worker, worker.actor.engine, batch, rollout_batch(batch)


def run(a) -> dict:
    # the distributed optimizer, as verl's default and the launch scripts run it
    worker, engine, batch, data = start_actor(a, device=a.device, remove_padding=a.remove_padding, dist_optimizer=True)
    return update_sync_save(a, worker, engine, batch, data)[0]


def update_sync_save(a, worker, engine, batch, data, after_update=None) -> tuple:
    """One DAPO update of a started actor (verl's compute_log_prob, noise on the old policy, update_actor), the
    weight sync into an HF receiver and verl's checkpoint save and resume: rank 0's result (None elsewhere),
    the old log-probs, and what ``after_update(engine)`` returned right after the update (on every rank)."""
    import torch.distributed as dist

    from mcore_dapo.devices import get_adapter
    from mcore_dapo.resharding import HFQwen3MoeReceiver
    from mcore_dapo.runtime.launch import peak_rss_mb
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    dp, dp_rank = engine.get_data_parallel_size(), engine.get_data_parallel_rank()
    bs = len(data)
    # the old policy: verl's compute_log_prob (infer_batch), then noise so that all clip ranges act
    td = engine_batch(data)
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
    mine = dispatch(td, dp, dp_rank)
    out = worker.compute_log_prob(mine)
    rows = slice(dp_rank * bs // dp, (dp_rank + 1) * bs // dp)
    logp = None
    if out is not None:
        logp = no_padding_2_padding(out["log_probs"], mine).float()
    logp = _broadcast_from_collectors(engine, logp, (bs // dp, RESPONSE))
    full = [torch.empty_like(logp) for _ in range(dp)]
    dist.all_gather(full, logp.contiguous(), group=engine.get_data_parallel_group())
    current = torch.cat(full)
    noise = torch.randn(bs, RESPONSE, generator=torch.Generator().manual_seed(3)) * 0.3
    old = (current + noise) * batch["response_mask"]

    td = engine_batch(data, old)
    mini = GROUPS * N
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                         global_batch_size=mini, mini_batch_size=mini, epochs=1, seed=1,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True)
    t_update = time.perf_counter()
    out = worker.update_actor(dispatch(td, dp, dp_rank))
    t_update = time.perf_counter() - t_update
    metrics = tu.get(out, "metrics") if out is not None else None
    after = after_update(engine) if after_update is not None else None

    receiver = HFQwen3MoeReceiver(hf_model(a.hf_path, dtype=engine.param_dtype))  # the rollout's dtype
    per_tensor, _ = engine.get_per_tensor_param()
    received = receiver.load_weights(per_tensor)
    sync_diff = received_vs_engine(engine, receiver)
    saved = saved_vs_received(engine, receiver, Path(a.work) / "verl-checkpoint")
    result = None
    tokens = int(batch["tokens"].shape[0] * PROMPT + batch["response_mask"].sum())  # prompt + real response tokens
    if dist.get_rank() == 0:
        work = Path(a.work)
        torch.save({**batch, "old_log_prob": old}, work / "batch.pt")
        torch.save({n: receiver.read_weight(n).clone() for n in receiver.targets}, work / "received.pt")
        scalar = {k: (v[0] if isinstance(v, list) else v) for k, v in metrics.items()}
        result = {"loss": float(scalar["loss"]), "grad_norm": float(scalar["grad_norm"]),
                  "metrics": {k: float(v) for k, v in scalar.items() if isinstance(v, (int, float))},
                  "world_size": dist.get_world_size(), "engine": type(engine).__name__,
                  "engine_classes": [c.__name__ for c in type(engine).__mro__ if c.__module__.startswith("mcore_dapo")],
                  "layout": engine.mcore_bridge.layout.describe(), "tensors_synced": len(received),
                  # what the engine built from verl's model keys (model_settings): full recompute by default
                  "recompute": [engine.tf_config.recompute_granularity, engine.tf_config.recompute_method,
                                engine.tf_config.recompute_num_layers],
                  "rewards": batch["rewards"].tolist(), "rows": [rows.start, rows.stop],
                  "received_vs_engine": sync_diff, "received_dtype": str(engine.param_dtype),
                  "update_seconds": round(t_update, 3), "tokens": tokens,
                  "tokens_per_second": round(tokens / t_update, 1),
                  "remove_padding": a.remove_padding, "peak_device_bytes": get_adapter().max_memory_allocated(),
                  "peak_rss_mb": peak_rss_mb(), **saved}
    return result, old, after


def offload_run(a) -> dict:
    """verl's param/grad/optimizer offload through verl's worker calls (what the launch scripts set), on
    the distributed optimizer (verl's offload frees the DDP buffers' param_data, which only it has): the
    buffers' storage after init, after each worker call and after a save; the weights exported while
    offloaded against the HF folder; then the same update and export by a second worker without
    offload, in the same processes (verl colocates engines so: one model-parallel state). That worker's
    update is :func:`run`'s, sync and checkpoint included: its result is ``"plain"``."""
    import torch.distributed as dist

    from mcore_dapo.io.hf_reader import HFReader

    def storage(engine) -> dict:
        """Storage elements of the DDP buffers (param_data, grad_data) on this rank, summed."""
        out = {"param": 0, "grad": 0, "numel": 0}
        for chunk in engine.module:
            for buf in [*chunk.buffers, *chunk.expert_parallel_buffers]:
                out["param"] += buf.param_data.untyped_storage().nbytes()
                out["grad"] += buf.grad_data.untyped_storage().nbytes()
                out["numel"] += buf.param_data.numel()
        return _all(out)

    def export(engine) -> dict:
        got = {n: t.detach().clone() for n, t in engine.get_per_tensor_param()[0]}
        if engine.is_param_offload_enabled:  # as verl's update_weights after the sync
            engine.to("cpu", model=True, optimizer=False, grad=False)
        return got

    def update(worker, engine, batch, data) -> tuple:
        old, metrics = one_update(worker, engine, batch, data)
        return old, {k: _scalar(metrics[k]) for k in ("loss", "grad_norm")}

    worker, engine, batch, data = start_actor(a, device=a.device, remove_padding=a.remove_padding, offload=True,
                                              dist_optimizer=True)
    r = {"offload_enabled": [engine.is_param_offload_enabled, engine.is_optimizer_offload_enabled],
         "dist_optimizer": engine.engine_config.use_distributed_optimizer, "after_init": storage(engine)}
    with HFReader(a.hf_path) as reader:
        before = export(engine)  # nothing trained yet: the HF folder's weights in the engine's dtype
        r["export_tensors"] = len(before)
        r["export_vs_hf_differ"] = sorted(n for n, t in before.items()
                                          if not torch.equal(t, reader.get(n).to(t.dtype)))
    r["after_export"] = storage(engine)
    old, r["offloaded_update"] = update(worker, engine, batch, data)
    r["after_update"] = storage(engine)
    trained = export(engine)
    r["export_moved"] = sum(not torch.equal(trained[n], before[n]) for n in before)
    folder = Path(a.work) / "offloaded-checkpoint"
    engine.save_checkpoint(str(folder), global_step=1)
    r["after_save"] = storage(engine)
    found = sorted(p.parent for p in folder.rglob(INDEX))
    r["checkpoint_found"] = bool(found)
    if found:
        with HFReader(found[0]) as reader:
            r["checkpoint_tensors"] = len(trained)
            r["checkpoint_vs_live_differ"] = sorted(n for n, t in trained.items()
                                                    if not torch.equal(t, reader.get(n).to(t.dtype)))

    # the same update without offload: a second worker, same weights, same batch; run()'s update, sync, save
    plain, plain_engine, _, _ = start_actor(a, device=a.device, remove_padding=a.remove_padding, offload=False,
                                            dist_optimizer=True)
    r["plain_after_init"] = storage(plain_engine)
    r["plain"], plain_old, plain_trained = update_sync_save(a, plain, plain_engine, batch, data, after_update=export)
    if r["plain"] is not None:
        r["plain_update"] = {k: r["plain"][k] for k in ("loss", "grad_norm")}
    r["old_logp_equal"] = bool(torch.equal(old, plain_old))
    r["offloaded_vs_plain_weights_differ"] = sorted(n for n in plain_trained
                                                    if not torch.equal(plain_trained[n], trained[n]))
    return r if dist.get_rank() == 0 else None


def _old_policy(worker, engine, batch, data) -> torch.Tensor:
    """verl's compute_log_prob (infer_batch) on the whole batch, plus the noise of :func:`run`."""
    from verl.utils import tensordict_utils as tu

    td = engine_batch(data)
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
    mine = dispatch(td, engine.get_data_parallel_size(), engine.get_data_parallel_rank())
    current = _gather_logp(engine, worker.compute_log_prob(mine), mine, len(data))
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(3)) * 0.3
    return (current + noise) * batch["response_mask"]


def one_update(worker, engine, batch, data) -> tuple:
    """verl's compute_log_prob (the old policy) then one ``update_actor`` of the whole batch as one
    mini-batch: the old log-probs and the update's metrics (the same on every rank)."""
    from verl.utils import tensordict_utils as tu

    old = _old_policy(worker, engine, batch, data)
    td = engine_batch(data, old)
    mini = GROUPS * N
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                         global_batch_size=mini, mini_batch_size=mini, epochs=1, seed=1,
                         dataloader_kwargs={"shuffle": False}, compute_loss=True)
    out = worker.update_actor(dispatch(td, engine.get_data_parallel_size(), engine.get_data_parallel_rank()))
    return old, _shared(engine, tu.get(out, "metrics") if out is not None else None)


def _all(counts: dict) -> dict:
    """Per-rank integer counts summed over all ranks."""
    import torch.distributed as dist

    keys = sorted(counts)
    t = torch.tensor([counts[k] for k in keys], dtype=torch.int64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def replay_run(a) -> dict:
    """Router replay through verl's worker calls: R2 (record in compute_log_prob, perturb the routers,
    replay in update_actor), then R3 with routes of an HF model in the rollout's format."""
    import torch.distributed as dist

    from mcore_dapo_checks import audit
    from mcore_dapo.verl_plugin.router_replay import AGREEMENT, REPLAYED, model_routers
    from mcore_dapo.verl_cpu.rollout import RouteRecorder
    from verl.utils import tensordict_utils as tu

    worker, engine, batch, data = start_actor(a, tp=a.tp, pp=a.pp, device=a.device, router_replay="R2",
                                              dispatcher=a.dispatcher)
    dp, dp_rank = engine.get_data_parallel_size(), engine.get_data_parallel_rank()
    mini = GROUPS * N
    probe = engine._mcore_route_probe
    result = {"layout": engine.mcore_bridge.layout.describe(), "dispatcher": engine.tf_config.moe_token_dispatcher_type,
              "routers": len(probe.routers)}

    def infer(td):
        tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False, compute_loss=False)
        return worker.compute_log_prob(dispatch(td, dp, dp_rank))

    def update(td):
        tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False, distillation_only=False,
                             global_batch_size=mini, mini_batch_size=mini, epochs=1, seed=1,
                             dataloader_kwargs={"shuffle": False}, compute_loss=True)
        out = worker.update_actor(dispatch(td, dp, dp_rank))
        return _shared(engine, tu.get(out, "metrics") if out is not None else None)

    # R2: compute_log_prob records the routes of every layer and token
    td = engine_batch(data)
    out = infer(td)
    recorded = _gather_routes(engine, out, dp_rank, len(data))
    # the old policy: those log-probs plus noise (as :func:`run`), so that the loss follows the new
    # log-probs (ratios near 1) and with them the routing
    current = _gather_logp(engine, out, dispatch(td, dp, dp_rank), len(data))
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(3)) * 0.3
    old = (current + noise) * batch["response_mask"]
    result["recorded_shape"] = [len(recorded), *recorded[0].shape[1:]]
    # a perturbation of the routers that changes routing without replay
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, router in model_routers(engine.module):
            router.weight.add_(torch.randn(router.weight.shape, generator=g).to(router.weight.dtype) * a.perturb)
    routed = torch.nested.as_nested_tensor(recorded, layout=torch.jagged)
    td = engine_batch(data)
    td["routed_experts"] = routed  # as the rollout's: compared, not replayed, by R2's recording pass
    infer(td)
    result["perturbed_vs_recorded"] = _shared(engine, dict(engine._mcore_routing_metrics)).get(AGREEMENT)
    engine._mcore_routing_metrics.clear()
    td = engine_batch(data, old)
    td["routed_experts"] = routed
    # the audit writes the perturbed weights, the batch with its routes and the grad norm: the same
    # update is recomputed below on the HF model with the recorded routes forced (and without)
    with audit.auditing(engine, Path(a.work) / "audit-r2"):
        metrics = update(td) or {}
    result["r2_update_vs_recorded"] = metrics.get(REPLAYED)
    result["r2_loss"] = _scalar(metrics.get("loss"))
    result["r2_grad_norm"] = _scalar(metrics.get("grad_norm"))

    # R3: routes of an HF model (the rollout's own routers), int32 [tokens - 1, layers, top_k] per sample
    # the same engine switched to R3 (one launch for both modes; verl reads the mode at each batch, and
    # builds R2 and R3 alike: replay-enabled routers)
    object.__setattr__(engine.engine_config.router_replay, "mode", "R3")
    hf = hf_model(a.hf_path, dtype=torch.float32)
    recorder = RouteRecorder(hf)
    routes = []
    with torch.no_grad():
        for row, n in zip(data.batch["input_ids"], data.batch["attention_mask"].sum(1).tolist()):
            recorder.rows.clear()
            hf(input_ids=row[: n - 1][None])  # every token fed to a rollout: all but the last
            routes.append(recorder.routes())
    recorder.close()
    result["rollout_routes_dtype"] = str(routes[0].dtype)
    td = engine_batch(data)
    td["routed_experts"] = torch.nested.as_nested_tensor([r.to(torch.int16) for r in routes], layout=torch.jagged)
    infer(td)
    result["r3_logprob_vs_rollout"] = _shared(engine, dict(engine._mcore_routing_metrics)).get(AGREEMENT)
    td = engine_batch(data, old)  # (union: data keeps these old log-probs)
    td["routed_experts"] = torch.nested.as_nested_tensor([r.to(torch.int16) for r in routes], layout=torch.jagged)
    metrics = update(td) or {}
    result["r3_update_vs_rollout"] = metrics.get(REPLAYED)
    result["r3_logprob_vs_rollout_in_update_metrics"] = metrics.get(AGREEMENT)
    # bad input: routes of the wrong shape, and R3 without routes
    for name, bad in (("wrong_shape", [r[:, :, :1] for r in routes]), ("missing", None)):
        td = engine_batch(data)
        if bad is not None:
            td["routed_experts"] = torch.nested.as_nested_tensor([r.to(torch.int16) for r in bad], layout=torch.jagged)
        try:
            infer(td)
            result[f"error_{name}"] = None
        except Exception as e:  # noqa: BLE001  (the worker's one-line UserError)
            result[f"error_{name}"] = f"{type(e).__name__}: {e}"
    if dist.get_rank() != 0:
        return None
    from mcore_dapo_checks.audit_reference import reference_step

    folder = next((Path(a.work) / "audit-r2").glob("step-*"))
    result["r2_reference_forced"] = reference_step(folder)
    result["r2_reference_native"] = reference_step(folder, force_routes=False)
    return result


def _gather_logp(engine, out, mine, bs: int) -> torch.Tensor:
    """The whole batch's log-probs ``[bs, RESPONSE]`` on every rank, from compute_log_prob's output."""
    import torch.distributed as dist
    from verl.workers.utils.padding import no_padding_2_padding

    dp = engine.get_data_parallel_size()
    logp = None if out is None else no_padding_2_padding(out["log_probs"], mine).float()
    logp = _broadcast_from_collectors(engine, logp, (bs // dp, RESPONSE))
    full = [torch.empty_like(logp) for _ in range(dp)]
    dist.all_gather(full, logp.contiguous(), group=engine.get_data_parallel_group())
    return torch.cat(full)


def _scalar(v):
    v = v[0] if isinstance(v, list) else v
    return None if v is None else float(v)


def _shared(engine, value):
    """A value from the ranks that have it (verl returns outputs on its collector ranks) to all ranks."""
    import torch.distributed as dist

    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return next((v for v in got if v), value)


def _gather_routes(engine, out, dp_rank: int, bs: int) -> list[torch.Tensor]:
    """The whole batch's recorded routes on every rank (verl returns each DP shard on its collectors)."""
    import torch.distributed as dist

    mine = None if out is None else (dp_rank, [t.clone() for t in out["routed_experts"].unbind()])
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, mine)
    shards = dict(x for x in got if x is not None)
    routes = [t for k in sorted(shards) for t in shards[k]]
    assert len(routes) == bs, (len(routes), bs)
    return routes


def saved_vs_received(engine, receiver, folder: Path) -> dict:
    """verl's own ``save_checkpoint`` (its MegatronCheckpointManager: HF weights through the plugin's
    checkpoint bridge, the optimizer through Megatron's dist checkpointing); the HF weights it wrote
    against what the rollout received; then ``load_checkpoint`` into disturbed parameters."""
    from mcore_dapo.io.hf_reader import HFReader

    engine.save_checkpoint(str(folder), global_step=1)
    found = sorted(p.parent for p in folder.rglob(INDEX))
    if not found:
        return {"checkpoint_hf_tensors": 0, "checkpoint_vs_received": None}
    with HFReader(found[0]) as reader:
        names = list(receiver.targets)
        worst = max(float((reader.get(n).float() - receiver.read_weight(n).float()).abs().max()) for n in names)
    # resume: disturb every parameter, load the checkpoint back through verl, compare again
    with torch.no_grad():
        for chunk in engine.module:
            for p in chunk.parameters():
                p.add_(1.0)
    engine.load_checkpoint(str(folder), del_local_after_load=False)
    resumed = received_vs_engine(engine, receiver)
    return {"checkpoint_hf_tensors": len(names), "checkpoint_vs_received": worst,
            "checkpoint_hf_folder": str(found[0].relative_to(folder)), "resumed_vs_received": resumed}


def received_vs_engine(engine, receiver) -> float:
    """Largest difference, over all ranks, between each rank's parameters and what the rollout
    received, taken back to the rank's shard through the bridge's inverse mapping (to_megatron),
    a path the export (to_hf after gathers) does not use."""
    import torch.distributed as dist

    from mcore_dapo.resharding.export import unwrap
    from mcore_dapo.runtime.model import local_params
    from mcore_dapo.runtime.parallel import parallel_info

    info, bridge = parallel_info(), engine.mcore_bridge
    worst = torch.zeros(())
    for lp in local_params([unwrap(c) for c in engine.module], bridge, info):
        rank, size = info.group_rank(lp.resolved.mapping.group)
        shard = lp.resolved.mapping.to_megatron([receiver.read_weight(h) for h in lp.resolved.hf], rank, size,
                                                bridge.dims)
        worst = torch.maximum(worst, (shard.float() - lp.param.detach().float()).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def _broadcast_from_collectors(engine, value, shape):
    """Log-probs live on the ranks verl collects from (TP0, last PP stage); share them with the
    other ranks of the same model-parallel group."""
    import torch.distributed as dist

    group = engine.get_model_parallel_group()
    if dist.get_world_size(group) == 1:
        return value
    flags = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, value is not None, group=group)
    src = dist.get_global_rank(group, flags.index(True))
    buf = value if value is not None else torch.empty(shape)
    dist.broadcast(buf, src=src, group=group)
    return buf


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.verl_engine")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--work", required=True)
    Layout.add_args(ap, ("tp", "pp", "ep"), ep=2)  # --pp: pipeline stages (--replay)
    ap.add_argument("--seed", type=int, default=7, help="seed of the batch (tokens, lengths of the responses)")
    ap.add_argument("--device", default="cpu", help="verl's trainer.device")
    ap.add_argument("--remove-padding", action="store_true", help="packed sequences (THD)")
    ap.add_argument("--replay", action="store_true", help="router replay R2 then R3 (replay_run)")
    ap.add_argument("--offload", action="store_true",
                    help="verl's param/grad/optimizer offload against the same update without it (offload_run)")
    ap.add_argument("--dispatcher", default="alltoall", choices=["alltoall", "allgather"])
    ap.add_argument("--perturb", type=float, default=0.05, help="noise added to the router weights (R2)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from mcore_dapo.runtime.launch import finish_worker

    return finish_worker(replay_run(a) if a.replay else offload_run(a) if a.offload else run(a), a.out)


if __name__ == "__main__":
    sys.exit(main())
