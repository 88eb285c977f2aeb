"""Weight-sync benchmark. Run under torchrun (``mcore-dapo sync-bench`` launches it)::

    torchrun --nproc-per-node 2 -m mcore_dapo_checks.bench_weight_sync --hf-path DIR --ep 2 --bucket-mb 1024

Builds the sharded Megatron model from the checkpoint, exports it ``--repeat``
times (timed, nothing consumed), once more checking every tensor bit for bit
against the checkpoint, then measures in the same processes what bounds a
sync: one flat collective per group carrying the same bytes as the sync's
collectives, and memcpy bandwidth. Rank 0 writes the JSON result.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def bench_parser(prog: str) -> argparse.ArgumentParser:
    """The arguments both sync benches take (this one and :mod:`mcore_dapo_checks.bench_vllm_sync`)."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("--hf-path", required=True)
    from mcore_dapo.bridge.layout import Layout

    Layout.add_args(ap)
    ap.add_argument("--bucket-mb", type=float, default=1024.0)
    ap.add_argument("--dtype", choices=sorted(TORCH), default=None,
                    help="model and export dtype (default: the checkpoint's)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--status-file", default=None, help="rank 0 writes its current step here")
    ap.add_argument("--out", default=None)
    return ap


def parse_args(argv=None):
    ap = bench_parser("python -m mcore_dapo_checks.bench_weight_sync")
    ap.add_argument("--device", default=None)
    ap.add_argument("--output-ring", type=int, default=1, help="pooled output buffers (0: a fresh one per bucket)")
    return ap.parse_args(argv)


def _status(a, text: str) -> None:
    if a.status_file and dist.get_rank() == 0:
        Path(a.status_file).write_text(text)


def _max(x: float) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed_sync(exporter) -> float:
    """Seconds of one sync, the slowest rank's; the buckets are dropped as they come."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in exporter.buckets():
        pass
    return _max(time.perf_counter() - t0)


def verify_against_checkpoint(exporter, reader, dtype, a) -> dict:
    bad, n = [], 0
    for b in exporter.buckets():
        _status(a, f"verifying bucket {b.index + 1}/{len(exporter.plan.buckets)}")
        for name, t in b.items:
            n += 1
            if not torch.equal(t.cpu(), reader.get(name).to(dtype)):
                bad.append(name)
    names = {p.name for bk in exporter.plan.buckets for p in bk.pieces()}
    complete = names == set(exporter.bridge.hf_names()) and n == len(names)
    mismatches = _max(float(len(bad)) + (0 if complete else 1e9))
    return {"bit_exact": mismatches == 0, "first_mismatch": bad[0] if bad else None}


def flat_limit(exporter, stats, repeat: int = 2) -> dict:
    """One collective per group with the bytes the sync moved over it (best of ``repeat``, buffers
    touched first): what coalescing everything into one call would take."""
    from mcore_dapo.resharding.comm import GROUP_NAMES, Comm

    comm, out = Comm(exporter.groups), {}
    dtype = exporter.plan.buckets[0].dtype
    size = torch.empty((), dtype=dtype).element_size()
    for group in GROUP_NAMES:  # a fixed order: stages differ in what they gathered, and in the order
        nbytes = stats.collectives.bytes.get(group, 0)
        if not _max(nbytes):
            continue
        n = nbytes // size  # the same on every member of the group (0 where a stage gathered nothing)
        buf = torch.zeros((comm.size(group), n) if group != "pp" else (n,), dtype=dtype, device=exporter.device)
        best = float("inf")
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            if n and group == "pp":
                comm.broadcast("pp", buf, 0)
            elif n:
                comm.all_gather_inplace(group, buf)
            best = min(best, _max(time.perf_counter() - t0))
        out[group] = {"bytes": nbytes, "seconds": best}
        del buf
    return out


def memcpy_gbps(numel: int, dtype, device, repeat: int = 3) -> float:
    from mcore_dapo.devices import get_adapter

    adapter = get_adapter(device.type)  # the adapter the run was started with (one per device kind)
    src = torch.ones(numel, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst.copy_(src)
        adapter.synchronize()
        best = min(best, time.perf_counter() - t0)
    return src.numel() * src.element_size() / best / 1e9


def _build(a):
    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter = init_parallel(layout, a.device)
    info = parallel_info()
    reader = HFReader(a.hf_path)
    dtype = a.dtype or DTYPES.get(reader.dtype(reader.keys()[0]), "bf16")
    _status(a, "building the sharded model")
    chunks, _ = build_model(bridge, adapter, dtype=dtype)
    _status(a, "loading the checkpoint")
    load_hf_weights(chunks, bridge, reader, info)
    return bridge, adapter, info, chunks, reader, dtype


def _limits(exporter, stats) -> dict:
    """What bounds a sync, measured in the same processes: flat collectives and one copy of every byte."""
    flat = flat_limit(exporter, stats)
    flat_s = sum(g["seconds"] for g in flat.values())
    plan = exporter.plan
    mem = memcpy_gbps(max(b.numel for b in plan.buckets), plan.buckets[0].dtype, exporter.device)
    bound_s = flat_s + stats.bytes / (mem * 1e9)
    return {
        "flat_collectives": flat, "flat_seconds": round(flat_s, 4),
        "flat_gbps": round(stats.bytes / flat_s / 1e9, 3) if flat_s else None,
        "memcpy_gbps": round(mem, 3), "bound_seconds": round(bound_s, 4),
        "bound_gbps": round(stats.bytes / bound_s / 1e9, 3),
    }


def run(a) -> dict:
    from mcore_dapo.resharding import WeightExporter

    bridge, adapter, info, chunks, reader, dtype = _build(a)
    exporter = WeightExporter(chunks, bridge, info, bucket_bytes=max(1, int(a.bucket_mb * (1 << 20))),
                              dtype=TORCH[dtype], output_ring=a.output_ring)
    dist.barrier()
    t0 = time.perf_counter()
    plan = exporter.plan
    plan_s = _max(time.perf_counter() - t0)
    times = []
    for i in range(a.repeat):
        _status(a, f"timed sync {i + 1}/{a.repeat}")
        times.append(timed_sync(exporter))
    stats = exporter.last_stats
    check = verify_against_checkpoint(exporter, reader, TORCH[dtype], a)
    _status(a, "measuring the limits")
    best = min(times)
    return {
        "layout": bridge.layout.describe(), "world_size": info.world_size, "device": adapter.name, "dtype": dtype,
        "tensors": stats.tensors, "bytes": stats.bytes, "buckets": stats.buckets, "bucket_bytes": exporter.bucket_bytes,
        "output_ring": a.output_ring,
        "collectives": int(_max(stats.collectives.total)), "collectives_by_group": dict(stats.collectives.calls),
        "per_tensor_collectives": plan.per_tensor_collectives(),
        "plan_seconds": round(plan_s, 4), "seconds": round(best, 4), "seconds_all": [round(t, 4) for t in times],
        "gbps": round(stats.bytes / best / 1e9, 3),
        "peak_buffer_bytes": int(_max(stats.peak_buffer_bytes)),
        **_limits(exporter, stats),
        **check,
    }


def render(r: dict) -> str:
    """The result as a small table."""
    gb, mib = r["bytes"] / 1e9, r["bucket_bytes"] / 2**20
    flat = r["flat_gbps"] if r["flat_gbps"] is not None else "n/a (no collective needed)"
    rows = [
        ("layout", f"{r['layout']} on {r['world_size']} {r['device']} processes, {r['dtype']}"),
        ("tensors / bytes", f"{r['tensors']} / {gb:.3f} GB in {r['buckets']} buckets of <= {mib:g} MiB"),
        ("collectives per sync",
         f"{r['collectives']} ({r['collectives_by_group']}); per-tensor export: {r['per_tensor_collectives']}"),
        ("sync", f"{r['seconds']} s ({r['gbps']} GB/s); all runs {r['seconds_all']}; plan {r['plan_seconds']} s"),
        ("limit: flat collectives", f"{r['flat_seconds']} s for the same bytes per group ({flat} GB/s of weights)"),
        ("limit: memcpy", f"{r['memcpy_gbps']} GB/s"),
        ("limit: flat + one copy", f"{r['bound_seconds']} s ({r['bound_gbps']} GB/s)"),
        ("peak exporter buffers", f"{r['peak_buffer_bytes'] / 2**20:.1f} MiB"),
        ("bit-exact vs checkpoint", "yes" if r["bit_exact"] else f"NO (first: {r['first_mismatch']})"),
    ]
    return kv_table(rows)


def kv_table(rows: list[tuple[str, str]]) -> str:
    """``label  value`` lines, the labels padded to one width."""
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
