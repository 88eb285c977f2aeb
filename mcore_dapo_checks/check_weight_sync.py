"""Check a weight sync end to end in one layout. Run under torchrun, one process per device::

    torchrun --nproc-per-node 2 -m mcore_dapo_checks.check_weight_sync --hf-path DIR --reference REF.pt --ep 2 --train

Builds the sharded Megatron model from the HF checkpoint, then on every rank:
exports it bit-exactly (large and small buckets, kept and cast dtype), syncs it
into an HF transformers model (logits against the reference), refuses receivers
of the wrong model without writing, catches a faulty receiver by checksums and,
with ``--train``, takes an optimizer step on the Megatron side and syncs again
into the same receiver (logits against Megatron's). Rank 0 writes a JSON summary;
the assertions are the caller's.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.check_weight_sync")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--reference", required=True)
    from mcore_dapo.bridge.layout import LAYOUT_FLAGS, Layout

    Layout.add_args(ap, (*LAYOUT_FLAGS, "vpp"))
    ap.add_argument("--vocab-divisible-by", type=int, default=None)
    ap.add_argument("--small-bucket-kb", type=int, default=48)
    ap.add_argument("--train", action="store_true", help="optimizer step, then a second sync")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _reduce(values: list[float], op=dist.ReduceOp.MAX) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def export_check(exporter, reader, bridge, cast=None, complete=True) -> dict:
    """Every exported tensor against the checkpoint, bit for bit; names against the bridge's list."""
    seen, bad, max_bucket = [], [], 0
    for b in exporter.buckets():
        max_bucket = max(max_bucket, b.nbytes)
        for name, t in b.items:
            seen.append(name)
            want = reader.get(name)
            if cast is not None:
                want = want.to(cast)
            if t.dtype != want.dtype or not torch.equal(t, want):
                bad.append(name)
    names_ok = len(seen) == len(set(seen)) and (not complete or sorted(seen) == sorted(bridge.hf_names()))
    stats, plan = exporter.last_stats, exporter.plan
    mismatches, names_bad = _reduce([len(bad), float(not names_ok)], dist.ReduceOp.SUM)
    return {
        "tensors": stats.tensors, "bytes": stats.bytes, "buckets": stats.buckets,
        "collectives": stats.collectives.as_dict(),
        "planned_collectives": plan.collectives_per_sync(exporter.info.pp_rank, broadcast_pp=exporter.broadcast_pp),
        "per_tensor_collectives": plan.per_tensor_collectives(),
        "peak_buffer_bytes": stats.peak_buffer_bytes, "max_bucket_bytes": max_bucket,
        "mismatches": int(mismatches), "first_mismatch": bad[0] if bad else None, "names_ok": names_bad == 0,
        "names": seen if not complete else None,
    }


def hf_model(hf_path, seed: int = 7, **overrides):
    """An HF transformers model of the checkpoint's config with fresh random weights (nothing loaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(hf_path))
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()


@torch.no_grad()
def hf_logits(model, tokens, attention_mask=None) -> torch.Tensor:
    return model(input_ids=tokens, attention_mask=attention_mask).logits.float()


def mismatch_check(exporter, hf_path) -> dict:
    """Receivers of the wrong model: a clear error, and not one weight written."""
    from mcore_dapo.errors import UserError
    from mcore_dapo.resharding import HFQwen3MoeReceiver, sync_weights

    out = {}
    for label, overrides in (("fewer_experts", {"num_experts": 4}), ("fewer_layers", {"num_hidden_layers": 3})):
        model = hf_model(hf_path, seed=11, **overrides)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            sync_weights(exporter, HFQwen3MoeReceiver(model))
            out[label] = {"error": None}
        except UserError as e:
            unchanged = all(torch.equal(before[k], v) for k, v in model.state_dict().items())
            out[label] = {"error": str(e), "unchanged": unchanged}
    return out


def faulty_check(exporter, receiver_model, name: str) -> dict:
    """A receiver that corrupts one tensor while loading: checksums must name it."""
    from mcore_dapo.resharding import ChecksumMismatch, HFQwen3MoeReceiver, sync_weights

    class Corrupting(HFQwen3MoeReceiver):
        def load_weights(self, weights):
            loaded = super().load_weights(weights)
            if name in loaded:
                self.read_weight(name).view(-1)[0] += 1.0
            return loaded

    try:
        sync_weights(exporter, Corrupting(receiver_model), verify=True)
        return {"error": None}
    except ChecksumMismatch as e:
        return {"error": str(e)}


def train_step(chunks, tf, tokens, lr: float = 1e-2) -> None:
    """Forward+backward through Megatron's schedule, Megatron's TP reduction of replicated grads, Adam."""
    from megatron.core.distributed import DistributedDataParallelConfig

    from mcore_dapo.megatron_compat import allreduce_tp_replicated_grads
    from mcore_dapo.runtime.forward import run_schedule

    params = [p for c in chunks for p in c.parameters()]
    for c in chunks:
        c.train()
        c.zero_grad()
    run_schedule(chunks, tokens, labels=torch.roll(tokens, -1, dims=1), forward_only=False)
    for c in chunks:
        c.ddp_config = DistributedDataParallelConfig()  # read by Megatron's reduction below
    allreduce_tp_replicated_grads(chunks, tf)
    torch.optim.Adam(params, lr=lr).step()
    for c in chunks:
        c.eval()


def megatron_logits(chunks, tokens, vocab: int):
    from mcore_dapo.runtime.forward import run_schedule

    with torch.no_grad():
        logits = run_schedule(chunks, tokens, micro_batch_size=1)
    return None if logits is None else logits[..., :vocab].float()


def _max_diff(a, b) -> float:
    return _reduce([-1.0 if a is None else (a - b).abs().max().item()])[0]


def run(a) -> dict:
    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.resharding import HFQwen3MoeReceiver, WeightExporter, sync_weights
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout, make_vocab_size_divisible_by=a.vocab_divisible_by)
    adapter = init_parallel(layout, "cpu")
    info = parallel_info()
    chunks, tf = build_model(bridge, adapter, dtype="fp32", make_vocab_size_divisible_by=a.vocab_divisible_by)
    ref = torch.load(a.reference)
    tokens, ref_logits = ref["tokens"], ref["logits"].float()
    small = WeightExporter(chunks, bridge, info, bucket_bytes=a.small_bucket_kb * 1024)
    r = {"layout": layout.describe(), "world_size": info.world_size, "padded_vocab": bridge.dims.padded_vocab_size}
    with HFReader(a.hf_path) as reader:
        load_hf_weights(chunks, bridge, reader, info)
        r["export_big"] = export_check(WeightExporter(chunks, bridge, info), reader, bridge)
        r["export_small"] = export_check(small, reader, bridge)
        r["export_bf16"] = export_check(WeightExporter(chunks, bridge, info, bucket_bytes=a.small_bucket_kb * 1024,
                                                       dtype=torch.bfloat16), reader, bridge, cast=torch.bfloat16)
        if info.pp_size > 1:
            owner = export_check(WeightExporter(chunks, bridge, info, broadcast_pp=False), reader, bridge,
                                 complete=False)
            r["export_owner"] = _owner_summary(owner, bridge)
    model = hf_model(a.hf_path)
    receiver = HFQwen3MoeReceiver(model)
    r["sync1"] = sync_weights(small, receiver, verify=True).as_dict()
    # the reference's padded batch with its attention mask, as the reference was computed
    r["receiver_vs_reference"] = _max_diff(hf_logits(model, tokens, ref.get("attention_mask")), ref_logits)
    r["mismatch"] = mismatch_check(small, a.hf_path)
    r["faulty"] = faulty_check(small, model, "model.layers.1.mlp.experts.5.up_proj.weight")
    if a.train:
        r.update(_train_and_resync(chunks, tf, small, receiver, model, tokens, bridge, a.hf_path))
    return r


def _owner_summary(owner: dict, bridge) -> dict:
    from megatron.core import parallel_state as ps

    names = [None] * ps.get_pipeline_model_parallel_world_size()
    dist.all_gather_object(names, owner.pop("names"), group=ps.get_pipeline_model_parallel_group())
    union = [n for stage in names for n in stage]
    owner["stages_partition_names"] = sorted(union) == sorted(bridge.hf_names())
    return owner


def _train_and_resync(chunks, tf, exporter, receiver, model, tokens, bridge, hf_path) -> dict:
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.resharding import sync_weights

    train_step(chunks, tf, tokens)
    stats = sync_weights(exporter, receiver, verify=True)
    with HFReader(hf_path) as reader:
        changed = sum(not torch.equal(reader.get(n), receiver.read_weight(n)) for n in bridge.hf_names())
    mega = megatron_logits(chunks, tokens, bridge.cfg.vocab_size)
    ours = hf_logits(model, tokens)
    return {
        "sync2": stats.as_dict(),
        "changed_fraction": changed / len(bridge.hf_names()),
        "trained_receiver_vs_megatron": _max_diff(mega, ours if mega is not None else None),
    }


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
