"""The forward (and, with ``--backward``, gradient) check behind ``mcore-convert verify``: build the bridge's
sharded Megatron model from an HF checkpoint (or a Megatron checkpoint with ``--mcore-path``) and compare it with
the HF model.

Run under torchrun, one process per device::

    torchrun --nproc-per-node 2 -m mcore_dapo.convert.forward_check --hf-path DIR --reference REF.pt --ep 2

``REF.pt`` holds a right-padded batch (``tokens``, ``attention_mask``, ``labels``, ``loss_mask``) and the HF
model's ``logits``, loss and gradients over the whole batch, computed in a clean process
(``python -m mcore_dapo.convert.hf_reference DIR REF.pt``). Each data-parallel rank runs its own share of the
sequences; logits are compared on the real tokens of each rank's rows, the loss and the gradients over the
whole batch. Every rank prints nothing; rank 0 writes the JSON result to ``--out`` (or stdout).

``prepare``, a function of :func:`run`, is called once the parallel state exists (the checks' mutations:
``mcore_dapo_checks.logits``).
"""

from __future__ import annotations

import argparse
import sys
import time

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.bridge.layout import LAYOUT_FLAGS


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.convert.forward_check")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--reference", required=True)
    Layout.add_args(ap, (*LAYOUT_FLAGS, "vpp"))
    ap.add_argument("--first", type=int, default=None, help="layers in the first pipeline stage (uneven stages)")
    ap.add_argument("--last", type=int, default=None, help="layers in the last pipeline stage (uneven stages)")
    ap.add_argument("--dispatcher", default="alltoall",
                    help="alltoall, allgather, or both comma-separated: one model each in this launch")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--vocab-divisible-by", type=int, default=None)
    ap.add_argument("--mcore-path", default=None, help="load this torch_dist checkpoint instead of the HF weights")
    ap.add_argument("--backward", action="store_true", help="also run a training forward+backward")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _reduced(values: list[float], device, op=None) -> list[float]:
    """``values`` all-reduced over every rank (MAX unless ``op``), through a tensor on the compute device
    (nccl and hccl reduce device tensors only)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op or dist.ReduceOp.MAX)
    return t.tolist()


def run(a, prepare=None) -> dict:
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    t0 = time.time()
    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout, make_vocab_size_divisible_by=a.vocab_divisible_by)
    adapter = init_parallel(layout, a.device)
    info = parallel_info()
    if prepare is not None:
        prepare()
    # no auxiliary load-balancing loss, as verl's engine trains (aux_loss_coeff=0): the backward's loss is
    # the cross-entropy alone, which the HF reference computes
    stages = {k: v for k, v in (("num_layers_in_first_pipeline_stage", a.first),
                                 ("num_layers_in_last_pipeline_stage", a.last)) if v is not None}
    dispatchers = a.dispatcher.split(",")
    if len(dispatchers) > 1:  # one model per dispatcher in this launch, built, compared and dropped in turn
        results = {d: _one(a, d, layout, bridge, adapter, info, stages) for d in dispatchers}
        return {"layout": layout.describe(), "world_size": info.world_size, **_data_parallel(a),
                "by_dispatcher": results, "seconds": round(time.time() - t0, 2)}
    result = _one(a, a.dispatcher, layout, bridge, adapter, info, stages)
    result.update(_data_parallel(a), seconds=round(time.time() - t0, 2))
    return result


def _data_parallel(a) -> dict:
    """Megatron's data-parallel and expert-data-parallel sizes, and the reference rows and loss tokens each
    data-parallel rank ran (gathered from every rank: the TP, PP and EP ranks of one data-parallel rank agree)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mcore_dapo.runtime.forward import data_parallel_rows

    ref = torch.load(a.reference, mmap=True)
    rows = data_parallel_rows(len(ref["tokens"]))
    mask = ref.get("loss_mask")
    mine = (ps.get_data_parallel_rank(), list(range(len(ref["tokens"])))[rows],
            None if mask is None else int(mask[rows].sum()))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    by_rank = {}
    for rank, its_rows, tokens in every:
        if by_rank.setdefault(rank, (its_rows, tokens)) != (its_rows, tokens):
            raise RuntimeError(f"the ranks of data-parallel rank {rank} ran different rows: {every}")
    return {"data_parallel": ps.get_data_parallel_world_size(),
            "expert_data_parallel": ps.get_expert_data_parallel_world_size(),
            "rows_by_dp_rank": [by_rank[r][0] for r in sorted(by_rank)],
            "loss_tokens_by_dp_rank": [by_rank[r][1] for r in sorted(by_rank)]}


def _one(a, dispatcher, layout, bridge, adapter, info, stages) -> dict:
    import torch

    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.forward import data_parallel_rows, run_schedule
    from mcore_dapo.runtime.model import build_model, load_hf_weights

    chunks, tf = build_model(bridge, adapter, dtype=a.dtype, dispatcher=dispatcher, aux_loss_coeff=0.0,
                             make_vocab_size_divisible_by=a.vocab_divisible_by, overrides=stages or None,
                             wrapped_in_ddp=a.backward)
    key_layout = None
    if a.mcore_path:
        from mcore_dapo.io.dist_ckpt import load_dist_checkpoint

        key_layout = load_dist_checkpoint(chunks, a.mcore_path)
        loaded = sum(1 for c in chunks for _ in c.parameters())
    else:
        with HFReader(a.hf_path) as reader:
            loaded = load_hf_weights(chunks, bridge, reader, info)
    ref = torch.load(a.reference, mmap=True)  # the gradients of a real-width reference are GBs: paged in, shared
    rows = data_parallel_rows(len(ref["tokens"]))  # this data-parallel rank's sequences
    tokens, ref_logits = ref["tokens"][rows], ref["logits"][rows].float()
    real = (ref["attention_mask"][rows] if "attention_mask" in ref else torch.ones_like(tokens)).bool()
    for c in chunks:
        c.eval()
    with torch.no_grad():
        logits = run_schedule(chunks, tokens, micro_batch_size=1)
    device = next(chunks[0].parameters()).device
    # on the real tokens of every last-stage rank's rows: max |diff|, mean |diff| and top-1 disagreement,
    # the largest over the ranks shared with every rank (others contribute -1)
    stat = [-1.0, -1.0, -1.0]
    if logits is not None:
        logits = logits[..., : bridge.cfg.vocab_size].float().cpu()[real]
        ref_logits = ref_logits[real]
        diff = (logits - ref_logits).abs()
        top1 = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean()
        stat = [diff.max().item(), diff.mean().item(), 1.0 - top1.item()]
    stat = _reduced(stat, device)
    stat[2] = 1.0 - stat[2]
    result = {
        "layout": layout.describe(),
        "world_size": info.world_size,
        "dispatcher": dispatcher,
        "device": adapter.name,
        "tensors_loaded_rank0": loaded,
        "key_layout": key_layout,
        "params_rank0": sum(p.numel() for c in chunks for p in c.parameters()),
        "max_abs_diff": stat[0],
        "mean_abs_diff": stat[1],
        "top1_agreement": stat[2],
    }
    if a.backward:
        result.update(backward(a, chunks, tf, bridge, info, rows, ref, device))
    return result


def backward(a, chunks, tf, bridge, info, rows, ref, device) -> dict:
    """A training forward+backward of this data-parallel rank's ``rows`` through Megatron's schedules with
    Megatron's DDP and its ``finalize_model_grads`` (as verl's engine trains: data-parallel and TP-replicated
    gradients reduced; the loss verl's token-mean over the global batch's loss tokens), then every parameter's
    gradient brought to HF names by the weight exporter (the same gathers as a weight sync) and compared on
    rank 0 with the HF model's gradient of the same loss over the whole batch (``ref["grads"]``)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads

    from mcore_dapo.resharding import WeightExporter
    from mcore_dapo.runtime.forward import run_schedule

    from mcore_dapo.errors import UserError

    if "grads" not in ref:
        raise UserError("--backward compares gradients, and the reference holds none: make it with "
                        "python -m mcore_dapo.convert.hf_reference ... --grads")
    # the reference's loss runs over as many logits as the model's padded output layer has
    padded = ref.get("padded_vocab") or bridge.cfg.vocab_size
    if padded != bridge.dims.padded_vocab_size:
        raise UserError(f"the reference's loss is over {padded} logits, the model pads its vocabulary to "
                        f"{bridge.dims.padded_vocab_size}: make the reference with --padded-vocab "
                        f"{bridge.dims.padded_vocab_size}")
    ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False)
    chunks = [DistributedDataParallel(config=tf, ddp_config=ddp, module=c) for c in chunks]
    tf.finalize_model_grads_func = finalize_model_grads
    for c in chunks:
        c.train()
        c.zero_grad_buffer()
    tokens = ref["tokens"][rows]
    mask = ref["loss_mask"][rows] if "loss_mask" in ref else torch.ones_like(tokens)
    # the global batch's loss tokens, summed over the data-parallel ranks as verl's engine does
    count = torch.tensor([float(mask.sum())], dtype=torch.float64, device=device)
    dist.all_reduce(count, group=ps.get_data_parallel_group())
    losses = run_schedule(chunks, tokens, labels=ref["labels"][rows], loss_mask=mask, num_tokens=int(count.item()),
                          forward_only=False, micro_batch_size=1)
    # each last-stage rank's parts of the global loss, summed over the data-parallel ranks
    part = torch.tensor([sum(x.item() for x in losses) if losses else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(part, group=ps.get_data_parallel_group())
    loss = _reduced([part.item() if losses is not None else -1.0], device)[0]
    out = {"train_loss": loss, "reference_loss": ref["loss"],
           "loss_rel_diff": abs(loss - ref["loss"]) / max(abs(ref["loss"]), 1e-30)}
    exporter = WeightExporter(chunks, bridge, info, tensors=lambda p: p.main_grad)
    worst, worst_l2, compared, missing, finite = (0.0, ""), (0.0, ""), 0, [], True
    diff_sq = ref_sq = 0.0
    compare = dist.get_rank() == 0  # every rank takes part in the export's gathers; rank 0 compares
    for name, grad in exporter.iter_weights():
        if not compare:
            continue
        want = ref["grads"].get(name)
        if want is None:
            missing.append(name)
            continue
        grad = grad.float().cpu()
        finite = finite and bool(torch.isfinite(grad).all())
        # relative to the tensor's largest reference gradient: one bound for tensors of any scale
        err = float((grad - want).abs().max() / want.abs().max().clamp_min(1e-30))
        # relative in the 2-norm: what bf16 (8-bit mantissas through the whole backward) is bounded in
        l2 = float((grad - want).norm() / want.norm().clamp_min(1e-30))
        diff_sq += float((grad - want).pow(2).sum())
        ref_sq += float(want.pow(2).sum())
        compared += 1
        if err >= worst[0]:
            worst = (err, name)
        if l2 >= worst_l2[0]:
            worst_l2 = (l2, name)
    out.update(grads_compared=compared, grads_reference=len(ref["grads"]), grads_not_in_reference=missing,
               grad_max_rel_err=worst[0], grad_worst=worst[1], grad_max_rel_l2=worst_l2[0],
               grad_worst_l2=worst_l2[1], grad_global_rel_l2=(diff_sq / max(ref_sq, 1e-60)) ** 0.5,
               grads_finite=finite)
    return out


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
