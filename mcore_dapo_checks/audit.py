"""Audit of verl's training steps on the plugin's engine against an HF transformers reference.

With :func:`audit_env` in the environment of verl's workers (``MCORE_DAPO_AUDIT_DIR=D`` and the engine hook
``MCORE_DAPO_ENGINE_HOOK=mcore_dapo_checks.audit:audited``), the plugin registers its engine classes wrapped by
:func:`audited` (:func:`mcore_dapo.verl_plugin.registrations.hooked`); the plugin never imports this module itself. Every wrapped ``train_batch`` first writes the weights it is about to update (HF format,
through :class:`~mcore_dapo.verl_plugin.hf_weights.HFWeightsIO`) and each rank's batch (tokens,
response mask, old log-probs, advantages, the routed experts the update replays under router
replay R2/R3, and with verl's rollout correction the importance weights and the rollout's log-probs) to ``D/step-N/``, then the loss, learning rate and gradient norm verl reports, each MoE
router's gradient norm before the optimizer step, Megatron's Adam settings, without replay the routes the
engine's routers chose in the update's forward by sample (the plugin's ``RouteProbe``), and the weights after the
update (``D/step-N/hf-after``); every checkpoint saved or loaded, what the engine holds then
(:func:`checkpoint_state`).
:func:`mcore_dapo_checks.audit_reference.reference` recomputes each step on the HF model loaded from those
weights in one process (verl's ``vanilla`` policy loss, token-mean over the mini-batch; its routers
forced to the batch's routes, else to the engine's) and returns
both gradient norms: the engine's whole path (verl's micro-batching and loss scaling, Megatron's
schedules, EP all-to-all, DDP reduction, bf16) against a plain one-process computation.

For tiny models: the weights are written at every step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path

import torch

from mcore_dapo.verl_plugin.registrations import AUDIT_ENV as ENV
from mcore_dapo.verl_plugin.registrations import HOOK_ENV, SYNC_TRACE_ENV

FIELDS = ("input_ids", "response_mask", "old_log_probs", "advantages")
ROUTES = "routed_experts"  # [tokens (or tokens - 1), MoE layers, top_k] per sample, when replay is on
# with verl's rollout correction (algorithm.rollout_correction, the asynchronous modes): the importance weights
# the update multiplies its policy-gradient terms with, and the rollout's own log-probs they come from
CORRECTION = ("rollout_is_weights", "rollout_log_probs")
KL = "ref_log_prob"  # with the KL loss on (actor.use_kl_loss): the reference engine's log-probs
# the mask verl's agent loop stored at rollout time (verl/trainer/ppo/v1/agent_loop_tq.py: loss_mask =
# response_mask), whose sum is the token-mean's denominator (verl/workers/engine/megatron/transformer_impl.py,
# forward_backward_batch); the rollout correction's rejection sampling updates response_mask only
LOSS_MASK = "loss_mask"


def audit_env(root) -> dict:
    """The environment that makes verl's workers audit every update into ``root``, and vLLM's workers record what
    each weight sync left in the engine (:mod:`mcore_dapo_checks.rollout_storage`)."""
    from mcore_dapo_checks.rollout_storage import rollout_env

    return {ENV: str(root), HOOK_ENV: f"{__name__}:audited", SYNC_TRACE_ENV: str(Path(root) / "sync.jsonl"),
            **rollout_env()}


def audited(cls):
    """``cls`` (an engine class of the plugin) with every step and checkpoint written down."""

    class Audited(cls):
        def train_batch(self, data, loss_function):
            return audited_train_batch(self, super().train_batch, data, loss_function)

        def on_checkpoint(self, kind: str, step) -> None:
            super().on_checkpoint(kind, step)
            checkpoint_state(self, kind, step)

    Audited.__name__ = Audited.__qualname__ = f"Audited{cls.__name__}"
    return Audited


@contextlib.contextmanager
def auditing(engine, root):
    """This engine's updates audited into ``root`` while the context lasts (an engine registered without the
    audit: the harnesses that audit one update of several)."""
    train_batch = engine.train_batch
    os.environ[ENV] = str(root)
    engine.train_batch = functools.partial(audited_train_batch, engine, train_batch)
    try:
        yield
    finally:
        os.environ.pop(ENV, None)
        del engine.train_batch  # the class's own again


def _pieces(v) -> list[torch.Tensor]:
    return [t.detach().cpu().clone() for t in (v.unbind() if getattr(v, "is_nested", False) else v)]


def audited_train_batch(engine, train_batch, data, loss_function):
    """``engine.train_batch`` with the weights before, the batch and the gradient norm written down."""
    import torch.distributed as dist

    root = Path(os.environ[ENV])
    step = getattr(engine, "_mcore_audit_step", 0)
    engine._mcore_audit_step = step + 1
    folder = root / f"step-{step:04d}"
    engine.bridge.save_weights(engine.module, folder / "hf")
    rank = dist.get_rank()
    if rank == 0:
        for name in ("config.json", "generation_config.json"):
            src = Path(engine.model_config.local_path) / name
            if src.is_file():
                shutil.copy(src, folder / "hf" / name)
    batch = {k: _pieces(data[k]) for k in (*FIELDS, ROUTES, *CORRECTION, KL, LOSS_MASK) if k in data.keys()}
    routers: dict[int, float] = {}
    lrs: list[float] = []
    optimizer = engine.optimizer
    step_fn, own = optimizer.step, "step" in vars(optimizer)

    parts: dict[str, float] = {}
    read_parts = PartGradNorms(engine.module, optimizer, parts, routers)

    def step_reading_the_learning_rate(*args, **kwargs):
        lrs.append(float(optimizer.param_groups[0]["lr"]))  # what this step applies (the scheduler moves after it)
        return step_fn(*args, **kwargs)

    optimizer.step = step_reading_the_learning_rate
    # without routes to replay, the routes the engine's routers chose in the update's forward, by sample: the
    # reference is routed as the engine was (a token whose router scores tie within bf16 rounding may take other
    # experts in the bf16 engine than in the fp32 reference, which moves the gradient far more than rounding does)
    probe = getattr(engine, "_mcore_route_probe", None) if ROUTES not in batch else None
    engine_routes = None
    if probe is not None:
        probe.keep(True)
    update_log_probs: dict = {}  # the update's own forward, by sample (the last pipeline stage computes them)

    def loss_keeping_log_probs(*args, **kwargs):
        keep_log_probs(update_log_probs, kwargs["model_output"], kwargs["data"])
        return loss_function(*args, **kwargs)

    try:
        with read_parts:
            out = train_batch(data, loss_keeping_log_probs)
        if probe is not None:
            engine_routes = probe.kept_routes()
    finally:
        if probe is not None:
            probe.keep(False)
        if own:
            optimizer.step = step_fn
        else:
            del optimizer.step  # the class's own again
    metrics = out["metrics"] if out is not None and "metrics" in out else {}
    grad_norm = metrics.get("grad_norm")
    engine.bridge.save_weights(engine.module, folder / "hf-after")  # the weights the update left
    from megatron.core import parallel_state as ps

    torch.save({"batch": batch, "dp_rank": ps.get_data_parallel_rank(), "grad_norm": None if grad_norm is None else float(grad_norm),
                "loss": _update_loss(engine, out), "lr": lrs[0] if lrs else None, "lrs": lrs,
                "optimizer": optimizer_settings(optimizer), "router_grad_norms": routers, "part_grad_norms": parts,
                "engine_routes": engine_routes, "update_log_probs": update_log_probs}, folder / f"rank{rank:03d}.pt")
    return out


def keep_log_probs(kept: dict, model_output, data) -> None:
    """The log-probs of each sample's response tokens as the update's forward computed them (what verl's loss takes,
    ``verl/workers/utils/losses.py``'s ``no_padding_2_padding``), by the sample's token ids, into ``kept``."""
    from verl.workers.utils.padding import no_padding_2_padding

    log_probs = no_padding_2_padding(model_output["log_probs"], data).detach().float().cpu()
    if data["prompts"].is_nested:  # the response lengths as no_padding_2_padding reads them
        lens = data["responses"].offsets().diff().tolist()
    else:
        lens = data["attention_mask"][:, data["prompts"].shape[1]:].sum(-1).tolist()
    for i, (ids, n) in enumerate(zip(_pieces(data["input_ids"]), lens)):
        kept[tuple(ids.tolist())] = log_probs[i, :int(n)].clone()


def optimizer_settings(optimizer) -> dict:
    """The Adam settings of Megatron's optimizer (``OptimizerConfig``; a chained optimizer's first: verl builds
    the dense and expert parts with one config), and the weight decays its parameter groups apply
    (``group_weight_decays``, set by the LR scheduler)."""
    cfg = getattr(optimizer, "config", None)
    if cfg is None and getattr(optimizer, "chained_optimizers", None):
        cfg = optimizer.chained_optimizers[0].config
    out = {k: float(getattr(cfg, k)) for k in ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad")}
    out["group_weight_decays"] = sorted({float(g["weight_decay"]) for g in optimizer.param_groups})
    return out


def _update_loss(engine, out) -> float | None:
    """The update's loss as verl's worker reports it (``engine_workers._postprocess_output``: the sum of
    this rank's micro-batch losses, averaged over the data-parallel group), on the last pipeline stage
    (``None`` elsewhere, where no loss is computed)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mcore_dapo.devices import get_adapter

    raw = out.get("loss") if out is not None else None
    value = float(sum(raw) if isinstance(raw, (list, tuple)) else (raw or 0.0))
    group = engine.get_data_parallel_group()
    if group is not None:  # on the compute device: nccl and hccl reduce device tensors only
        t = torch.tensor([value], dtype=torch.float64, device=get_adapter().local_device())
        dist.all_reduce(t, group=group)
        value = float(t) / dist.get_world_size(group)
    return value if ps.is_pipeline_last_stage(ignore_virtual=True) else None


# the parts of the model whose gradient norms the audit compares with the reference's, by Megatron's parameter names
# (the reference's by HF names: mcore_dapo_checks.audit_reference.hf_part); the first pattern that matches wins
MEGATRON_PARTS = (
    ("embeddings", r"embedding\.word_embeddings\."),
    ("output layer", r"output_layer\."),
    ("norms", r"(layernorm|layer_norm|final_norm)"),
    ("routers", r"\.mlp\.router\."),
    ("shared experts", r"\.mlp\.shared_experts?\."),
    ("experts", r"\.mlp\.experts\."),
    ("attention", r"\.self_attention\."),
    ("dense mlp", r"\.mlp\."),
)


def part_of(name: str, parts=MEGATRON_PARTS) -> str:
    """The part of parameter ``name`` by ``parts`` (:data:`MEGATRON_PARTS`, or the reference's HF_PARTS)."""
    import re

    for part, pattern in parts:
        if re.search(pattern, name):
            return part
    raise ValueError(f"{name}: no part of {[p for p, _ in parts]} matches this parameter")


class PartGradNorms:
    """The gradient norm of each part of the model (:data:`MEGATRON_PARTS`), read from the very gradients Megatron's
    optimizer counts in its grad norm: while active, each (sub-)optimizer's ``get_main_grads_for_grad_norm`` (called
    by Megatron after the model's reduced gradients are copied to its main parameters, before clipping) also sums
    the squares of those gradients by part, its main parameters named through the model parameters they shard, and
    reduces them over the optimizer's grad-stats group as Megatron reduces its norm. Their root-sum-square is the grad
    norm verl reports (the audit checks it). ``routers``, when given, gets each MoE router's norm by layer number
    (1-based) the same way: read from the model parameters instead (``main_grad``), a rank's view is partly its own
    unreduced gradient under the distributed optimizer, which reduce-scatters the gradient and keeps only its
    shard reduced (one data-parallel rank then held layers 1-2's reduced, the other layers 3-4's)."""

    def __init__(self, chunks, optimizer, out: dict, routers: dict | None = None):
        from mcore_dapo.resharding.export import unwrap
        from mcore_dapo.verl_plugin.router_replay import model_routers

        self.subs = list(getattr(optimizer, "chained_optimizers", None) or [optimizer])
        self.names = {id(p): n for c in chunks for n, p in c.named_parameters()}
        self.router_layers = {id(r.weight): int(number) for number, r in model_routers(chunks)}
        # every layer number of the model, on every rank (each pipeline stage holds its own layers; the all-reduce
        # needs one length everywhere); a layer counts as a router's where some rank holds one
        self.layer_count = max(int(unwrap(c).config.num_layers) for c in chunks)
        self.out, self.routers = out, routers
        self.sums: dict[str, float] = {}

    def _model_params(self, sub) -> dict[int, torch.nn.Parameter]:
        """The model parameter of each main parameter (by id): the distributed optimizer's shards, or the mixed
        precision optimizer's fp32 copies, group by group beside their model parameters."""
        pairs = [("model_float16_groups", "shard_fp32_from_float16_groups"), ("model_fp32_groups", "shard_fp32_groups"),
                 ("float16_groups", "fp32_from_float16_groups"), ("fp32_from_fp32_groups", "fp32_from_fp32_groups")]
        out = {}
        for model_name, main_name in pairs:
            for model_group, main_group in zip(getattr(sub, model_name, []) or [], getattr(sub, main_name, []) or []):
                for model_p, main_p in zip(model_group, main_group):
                    out[id(main_p)] = model_p
        return out

    def _reading(self, sub, original):
        def get_main_grads_for_grad_norm():
            grads = original()
            if id(sub) in self.done:
                return grads
            self.done.add(id(sub))
            import torch.distributed as dist

            from mcore_dapo.devices import get_adapter

            model = self._model_params(sub)
            chosen = {id(g) for g in grads}
            sums = {part: 0.0 for part, _ in MEGATRON_PARTS}
            sums.update({("router", n): 0.0 for n in range(1, self.layer_count + 1)})
            sums.update({("held", n): float(n in self.router_layers.values()) for n in range(1, self.layer_count + 1)})
            for p in sub.get_parameters():
                g = p.grad
                if g is None or id(g) not in chosen:
                    continue
                model_p = model.get(id(p), p)
                name = self.names.get(id(model_p))
                if name is None:
                    raise ValueError("a gradient Megatron counts belongs to no named model parameter")
                square = float(g.detach().float().pow(2).sum())
                sums[part_of(name)] += square
                if id(model_p) in self.router_layers:
                    sums[("router", self.router_layers[id(model_p)])] += square
            names = list(sums)
            t = torch.tensor([sums[n] for n in names], dtype=torch.float64, device=get_adapter().local_device())
            dist.all_reduce(t, group=sub.get_grad_stats_parallel_group())
            for n, v in zip(names, t.tolist()):
                self.sums[n] = self.sums.get(n, 0.0) + float(v)
            self.out.clear()
            self.out.update({n: v ** 0.5 for n, v in self.sums.items()
                             if isinstance(n, str) and (v > 0 or n not in ("shared experts", "dense mlp"))})
            if self.routers is not None:
                self.routers.clear()
                self.routers.update({n[1]: v ** 0.5 for n, v in self.sums.items()
                                     if isinstance(n, tuple) and n[0] == "router" and self.sums[("held", n[1])] > 0})
            return grads

        return get_main_grads_for_grad_norm

    def __enter__(self):
        self.done: set[int] = set()
        self.originals = []
        for sub in self.subs:
            own = "get_main_grads_for_grad_norm" in vars(sub)
            original = sub.get_main_grads_for_grad_norm
            self.originals.append((sub, own, original))
            sub.get_main_grads_for_grad_norm = self._reading(sub, original)
        return self

    def __exit__(self, *exc):
        for sub, own, original in self.originals:
            if own:
                sub.get_main_grads_for_grad_norm = original
            else:
                del sub.get_main_grads_for_grad_norm
        return False


def checkpoint_state(engine, kind: str, step) -> None:
    """What the engine holds right after a checkpoint ``save`` or ``load`` (``D/checkpoint-<kind>-<step>/``,
    one file a rank): the model's parameters, each optimizer's parameters (the distributed optimizer's fp32
    main shards) with their Adam state, the LR scheduler's state and the RNG states verl's checkpoint
    manager saves. A resumed run's ``load`` against the interrupted run's ``save`` shows what was restored."""
    import torch.distributed as dist

    folder = Path(os.environ[ENV]) / f"checkpoint-{kind}-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(held_state(engine), folder / f"rank{dist.get_rank():03d}.pt")


def held_state(engine) -> dict:
    import random

    import numpy as np
    from megatron.core import tensor_parallel

    model = {f"{i}.{name}": p.detach().clone() for i, chunk in enumerate(engine.module)
             for name, p in chunk.named_parameters()}
    subs = getattr(engine.optimizer, "chained_optimizers", None) or [engine.optimizer]
    optim = []
    for sub in subs:
        inner = getattr(sub, "optimizer", sub)  # Megatron's wrapper around torch's AdamW
        for group in inner.param_groups:
            for p in group["params"]:
                optim.append({"param": p.detach().clone(),
                              **{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inner.state[p].items()}})
    rng = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
           "tracker": {k: v.clone() for k, v in tensor_parallel.get_cuda_rng_tracker().get_states().items()}}
    sched = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
    return {"model": model, "optimizer": optim, "lr_scheduler": sched, "rng": rng,
            "lr": [float(g["lr"]) for sub in subs for g in getattr(sub, "optimizer", sub).param_groups]}
