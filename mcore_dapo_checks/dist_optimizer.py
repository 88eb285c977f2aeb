"""Megatron's distributed optimizer against its plain one: the same steps, the same parameters.

Run under torchrun::

    torchrun --nproc-per-node 2 -m mcore_dapo_checks.dist_optimizer --hf-path DIR --ep 2 --dtype bf16

Builds the bridge's model twice from the same HF weights, wraps each in Megatron's
DistributedDataParallel (``use_distributed_optimizer`` True for one, False for the other), gets each
optimizer from ``megatron.core.optimizer.get_megatron_optimizer`` with the OptimizerConfig verl's
Megatron engine builds (``verl/utils/megatron/optimizer.py``, ``init_megatron_optim_config``), and runs
``--steps`` identical steps: every data-parallel rank its own batch, the same for both models. Rank 0
writes the JSON result: the largest difference of the fp32 parameters (the optimizers' fp32 main
parameters; in fp32, the model's own) and of the model parameters, the grad norms of both, and how the
distributed optimizer's Adam state is split over the ranks.
"""

from __future__ import annotations

import argparse
import sys
import time

from mcore_dapo.bridge import Bridge, Layout


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.dist_optimizer")
    ap.add_argument("--hf-path", required=True)
    Layout.add_args(ap, ("tp", "pp", "ep"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--dispatcher", default="alltoall")
    ap.add_argument("--device", default=None)
    ap.add_argument("--checkpoint", default=None,
                    help="save the distributed optimizer's state here (torch_dist, verl's format) and load it into a "
                         "fresh one")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def optimizer_config(dtype: str, distributed: bool, lr: float, clip_grad: float):
    """The OptimizerConfig of verl 0.9.1's ``init_megatron_optim_config`` (Adam; bf16: ``bf16=True``,
    ``params_dtype=bfloat16``; fp32: neither), with a learning rate large enough to move bf16 weights."""
    import torch
    from megatron.core.optimizer import OptimizerConfig

    half = dtype == "bf16"
    return OptimizerConfig(optimizer="adam", lr=lr, min_lr=0.0, clip_grad=clip_grad, weight_decay=0.01,
                           use_distributed_optimizer=distributed, bf16=half, fp16=False,
                           params_dtype=torch.bfloat16 if half else torch.float32)


def build(a, bridge, adapter, info, distributed: bool):
    """The model chunks (Float16Module for bf16, as verl's engine) in Megatron's DDP, and the optimizer."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer

    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.model import build_model, load_hf_weights

    chunks, tf = build_model(bridge, adapter, dtype=a.dtype, dispatcher=a.dispatcher, aux_loss_coeff=0.0, wrapped_in_ddp=True)
    with HFReader(a.hf_path) as reader:
        load_hf_weights(chunks, bridge, reader, info)
    if tf.bf16:
        from megatron.core.transformer.module import Float16Module

        chunks = [Float16Module(tf, c) for c in chunks]
    # what the verl plugin's engine builds (mcore_dapo/verl_plugin/engine.py), overlap off as in verl's default
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distributed)
    chunks = [DistributedDataParallel(config=tf, ddp_config=ddp, module=c) for c in chunks]
    opt = get_megatron_optimizer(optimizer_config(a.dtype, distributed, a.lr, a.clip_grad), chunks)
    return chunks, opt


def batch(vocab: int, dp_rank: int, step: int):
    """This data-parallel rank's tokens and labels for ``step`` (alike for both models)."""
    import torch

    from mcore_dapo_checks.tiny import tiny_prompts

    tokens = tiny_prompts(vocab, batch=2, seq=16, seed=1000 + 10 * step + dp_rank)
    return tokens, torch.roll(tokens, -1, dims=1)


def train_step(chunks, opt, tokens, labels) -> dict:
    from megatron.core.distributed import finalize_model_grads

    from mcore_dapo.runtime.forward import run_schedule

    for c in chunks:
        c.train()
        c.zero_grad_buffer()
    opt.zero_grad()
    losses = run_schedule(chunks, tokens, labels=labels, forward_only=False, micro_batch_size=1)
    finalize_model_grads(chunks)  # the data-parallel reduction: all-reduce, or reduce-scatter when distributed
    ok, grad_norm, _ = opt.step()
    loss = sum(x.item() for x in losses) / len(losses) if losses else None
    return {"update_successful": bool(ok), "grad_norm": float(grad_norm), "loss": loss}


def optimizers(opt) -> list:
    return list(getattr(opt, "chained_optimizers", [opt]))


def fp32_params(opt) -> dict:
    """Each model parameter -> the fp32 tensor its optimizer updates, and where it lies in the parameter
    (a flat slice ``start:end``: the whole parameter, or this rank's shard for the distributed optimizer)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    out = {}
    for o in optimizers(opt):
        if isinstance(o, DistributedOptimizer):
            model_groups = o.model_float16_groups + o.model_fp32_groups
            shard_groups = o.shard_fp32_from_float16_groups + o.shard_fp32_groups
            for params, shards in zip(model_groups, shard_groups):
                for p, shard in zip(params, shards):
                    r = o._get_model_param_range_map(p)["param"]
                    out[p] = (shard, r.start, r.end)
        elif hasattr(o, "float16_groups"):  # Float16OptimizerWithFloat16Params
            for params, mains in zip(o.float16_groups, o.fp32_from_float16_groups):
                for p, main in zip(params, mains):
                    out[p] = (main, 0, p.numel())
            for params in o.fp32_from_fp32_groups:
                for p in params:
                    out[p] = (p, 0, p.numel())
        else:  # FP32Optimizer: the model's own parameters
            for g in o.optimizer.param_groups:
                for p in g["params"]:
                    out[p] = (p, 0, p.numel())
    return out


def adam_state(opt, expert: set) -> dict:
    """Adam state elements (exp_avg + exp_avg_sq) this rank holds, dense and expert parameters apart."""
    counts = {"dense": 0, "expert": 0}
    for o in optimizers(opt):
        for group in o.optimizer.param_groups:
            for p in group["params"]:
                st = o.optimizer.state.get(p, {})
                n = sum(st[k].numel() for k in ("exp_avg", "exp_avg_sq") if k in st)
                counts["expert" if id(p) in expert else "dense"] += n
    return counts


def sharding_kwargs() -> dict:
    """The distributed optimizer's checkpoint format verl 0.9.1's checkpoint manager asks for
    (``_build_sharded_state_dict_metadata``): ``fully_sharded_model_space`` before megatron-core 0.14 (a
    keyword there), ``dp_reshardable`` content metadata from 0.14 on."""
    from mcore_dapo.versions import megatron_version

    if megatron_version() < (0, 14, 0):
        return {"sharding_type": "fully_sharded_model_space"}
    return {"metadata": {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
                         "chained_optim_avoid_prefix": True}}


def optimizer_round_trip(a, bridge, adapter, info, chunks, opt, folder: str) -> dict:
    """Save the distributed optimizer's sharded state with Megatron's dist_checkpointing in the format verl's
    checkpoint manager asks for (:func:`sharding_kwargs`), load it into the optimizer of a freshly built model
    (a resume: no step taken yet), and compare what was loaded with what was saved, bit for bit."""
    import torch
    from megatron.core import dist_checkpointing

    from pathlib import Path

    import torch.distributed as dist

    if dist.get_rank() == 0:
        Path(folder).mkdir(parents=True, exist_ok=True)
    dist.barrier()
    kw = sharding_kwargs()
    model_sd = {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}
    dist_checkpointing.save({"optimizer": opt.sharded_state_dict(model_sd, is_loading=False, **kw)}, folder)
    fresh_chunks, fresh = build(a, bridge, adapter, info, True)
    fresh_sd = {f"model{i}": c.sharded_state_dict() for i, c in enumerate(fresh_chunks)}
    loaded = dist_checkpointing.load({"optimizer": fresh.sharded_state_dict(fresh_sd, is_loading=True, **kw)}, folder)
    fresh.load_state_dict(loaded["optimizer"])
    saved_main, fresh_main = fp32_params(opt), fp32_params(fresh)
    old_params = [p for c in chunks for p in c.parameters()]
    new_params = [p for c in fresh_chunks for p in c.parameters()]
    differ, compared = [], 0
    for o, n in zip(optimizers(opt), optimizers(fresh)):
        for og, ng in zip(o.optimizer.param_groups, n.optimizer.param_groups):
            for op, np_ in zip(og["params"], ng["params"]):
                ost, nst = o.optimizer.state[op], n.optimizer.state[np_]
                for k in sorted(set(ost) | set(nst)):
                    compared += 1
                    if k not in ost or k not in nst or not torch.equal(ost[k], nst[k]):
                        differ.append(k)
    for op, np_ in zip(old_params, new_params):
        if op in saved_main:
            compared += 1
            if not torch.equal(saved_main[op][0], fresh_main[np_][0]):
                differ.append("main_param")
    return {"compared": compared, "differ": sorted(set(differ)),
            "state_keys": sorted({k for o in optimizers(fresh) for st in o.optimizer.state.values() for k in st})}


def run(a) -> dict:
    import torch.distributed as dist

    from megatron.core import parallel_state as ps
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    t0 = time.time()
    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter = init_parallel(layout, a.device)
    info = parallel_info()
    built = {name: build(a, bridge, adapter, info, name == "distributed") for name in ("distributed", "plain")}
    before = {p: t.detach().clone() for p, (t, _, _) in fp32_params(built["plain"][1]).items()}
    steps = {name: [] for name in built}
    for step in range(a.steps):
        tokens, labels = batch(bridge.cfg.vocab_size, ps.get_data_parallel_rank(), step)
        for name, (chunks, opt) in built.items():
            steps[name].append(train_step(chunks, opt, tokens, labels))

    (dchunks, dopt), (pchunks, popt) = built["distributed"], built["plain"]
    dparams = [p for c in dchunks for p in c.parameters()]
    pparams = [p for c in pchunks for p in c.parameters()]
    names = [n for c in pchunks for n, _ in c.named_parameters()]
    # the distributed optimizer's main parameters (this rank's shards) against the same slices of the plain one's
    dmain, pmain = fp32_params(dopt), fp32_params(popt)
    fp32_diff, worst, compared = 0.0, None, {"dense": 0, "expert": 0}
    for name, dp, pp in zip(names, dparams, pparams):
        shard, start, end = dmain.get(dp, (None, 0, 0))  # no shard of it on this rank
        full, _, _ = pmain[pp]
        ref = full.detach().reshape(-1)[start:end]
        d = (shard.detach().reshape(-1) - ref).abs().max().item() if end > start else 0.0
        if d > fp32_diff:
            fp32_diff, worst = d, name
        compared["dense" if getattr(pp, "allreduce", True) else "expert"] += end - start
    moved = sum(int(((full.detach() - before[p]).abs() > a.lr / 10).sum()) for p, (full, _, _) in pmain.items())
    model_diff = max((dp.detach().float() - pp.detach().float()).abs().max().item() for dp, pp in zip(dparams, pparams))
    model_rel = max(((dp.detach().float() - pp.detach().float()).abs() / pp.detach().float().abs().clamp_min(1e-30))
                    .max().item() for dp, pp in zip(dparams, pparams))

    def is_expert(p):  # Megatron's DDP keeps these in the expert buffers (expert data-parallel group)
        return not getattr(p, "allreduce", True)

    expert_main = {id(t) for m, params in ((dmain, dparams), (pmain, pparams)) for p in params
                   if is_expert(p) and p in m for t in m[p][:1]}
    dstate, pstate = adam_state(dopt, expert_main), adam_state(popt, expert_main)

    round_trip = None
    if a.checkpoint:
        round_trip = optimizer_round_trip(a, bridge, adapter, info, dchunks, dopt, a.checkpoint)

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {
        "checkpoint_round_trip": round_trip,
        "rank": info.rank, "dp_rank": ps.get_data_parallel_rank(),
        "fp32_max_abs_diff": fp32_diff, "fp32_worst": worst, "fp32_compared": compared,
        "fp32_moved": moved, "fp32_numel": sum(t.numel() for t, _, _ in pmain.values()),
        "model_max_abs_diff": model_diff, "model_max_rel_diff": model_rel,
        "adam_state_distributed": dstate, "adam_state_plain": pstate,
        "numel": {"dense": sum(p.numel() for p in pparams if not is_expert(p)),
                  "expert": sum(p.numel() for p in pparams if is_expert(p))},
        "optimizers": {"distributed": [type(o).__name__ for o in optimizers(dopt)],
                       "plain": [type(o).__name__ for o in optimizers(popt)]},
    })
    return {
        "layout": layout.describe(), "dtype": a.dtype, "world_size": info.world_size,
        "dp_size": ps.get_data_parallel_world_size(),
        "expert_dp_size": ps.get_expert_data_parallel_world_size(),
        "device": adapter.name, "steps": steps, "ranks": gathered,
        "seconds": round(time.time() - t0, 2),
    }


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
