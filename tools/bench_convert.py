#!/usr/bin/env python
"""Benchmark mcore-convert on a synthetic checkpoint with Qwen3-30B-A3B's real widths.

Builds HF safetensors checkpoints with the real widths (hidden 2048, 128 experts of ffn 768,
32/4 heads of 128, vocab 151936, bf16) but only a few layers, then for each layer count:

* the disk's own bound, measured in the same run: copying the checkpoint's files (read + write
  of the same bytes, fsync'd), which any conversion has to do at least;
* ``hf2mcore`` and ``mcore2hf`` with N processes: seconds, GB/s, peak RSS of each process
  against the target 2 x (model bytes / N) + 1 GB;
* the naive approach (transformers ``from_pretrained`` of the whole model in one process, then
  a Megatron save), side by side.

    python tools/bench_convert.py --layers 2 4 --nproc 2 --workdir DIR [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

REAL = dict(hidden=2048, experts=128, ffn=768, heads=32, kv=4, head_dim=128, vocab=151936)


def make_checkpoint(out: Path, layers: int, seed: int = 0) -> int:
    """Write a bf16 HF checkpoint (one shard per layer plus one for embeddings); returns bytes."""
    import torch
    from safetensors.torch import save_file

    from mcore_dapo.bridge import Bridge, parse_hf_config

    raw = json.loads((Path(__file__).resolve().parent.parent / "configs/models/qwen3-30b-a3b/config.json").read_text())
    raw["num_hidden_layers"] = layers
    raw["max_window_layers"] = layers
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    shapes = Bridge(parse_hf_config(raw)).hf_shapes()
    g = torch.Generator().manual_seed(seed)
    groups: dict[str, list[str]] = {}
    for name in shapes:
        key = name.split(".")[2] if name.startswith("model.layers.") else "other"
        groups.setdefault(key, []).append(name)
    weight_map, total = {}, 0
    for i, (key, names) in enumerate(groups.items()):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: (torch.randn(shapes[n], generator=g) * 0.02).to(torch.bfloat16) for n in names}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update({n: fname for n in names})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    return total


def disk_bound(src: Path, dst: Path) -> float:
    """Seconds to copy src's files to dst (read + write, fsync'd)."""
    t = time.time()
    dst.mkdir()
    for f in src.iterdir():
        with open(f, "rb") as r, open(dst / f.name, "wb") as w:
            shutil.copyfileobj(r, w, 64 << 20)
            w.flush()
            os.fsync(w.fileno())
    return time.time() - t


def run_naive(hf: Path, out: Path) -> dict:
    from mcore_dapo.runtime.launch import torchrun

    out.mkdir()
    t = time.time()
    r = torchrun("mcore_dapo_checks.naive_convert", ["--hf-path", str(hf), "--partial", str(out)], 1, timeout=None)
    r["wall_seconds"] = round(time.time() - t, 2)
    return r


def bench_one(work: Path, layers: int, nproc: int, naive: bool) -> dict:
    from mcore_dapo.bridge import Layout
    from mcore_dapo.convert.api import hf2mcore, mcore2hf

    hf = work / f"hf-{layers}"
    nbytes = make_checkpoint(hf, layers)
    gb = nbytes / 1e9
    row = {"layers": layers, "nproc": nproc, "model_gb": round(gb, 3)}
    t = disk_bound(hf, work / f"copy-{layers}")
    shutil.rmtree(work / f"copy-{layers}")
    row["disk_copy_gbps"] = round(gb / t, 3)
    t = time.time()
    m = hf2mcore(hf, work / f"mcore-{layers}", Layout(ep=nproc), nproc=nproc, progress=False)
    t_h = time.time() - t
    t = time.time()
    r = mcore2hf(work / f"mcore-{layers}", work / f"back-{layers}", nproc=nproc, progress=False)
    t_m = time.time() - t
    assert not r["checksum_mismatches"], "round trip is not bit-exact"
    bound_mb = (2 * nbytes / nproc + 1e9) / 2**20
    row.update(
        hf2mcore_s=round(t_h, 2), hf2mcore_gbps=round(gb / t_h, 3), hf2mcore_worker_s=m["seconds"],
        hf2mcore_rss_mb=[round(x) for x in m["peak_rss_mb"]],
        mcore2hf_s=round(t_m, 2), mcore2hf_gbps=round(gb / t_m, 3), mcore2hf_worker_s=r["seconds"],
        mcore2hf_rss_mb=[round(x) for x in r["peak_rss_mb"]],
        rss_target_mb=round(bound_mb),
        fraction_of_disk_bound=round((gb / t_h) / row["disk_copy_gbps"], 3),
        round_trip_bit_exact=True,
    )
    if naive:
        n = run_naive(hf, work / f"naive-{layers}")
        row.update(naive_s=n["wall_seconds"], naive_gbps=round(gb / n["wall_seconds"], 3),
                   naive_rss_mb=round(n["peak_rss_mb"]))
        shutil.rmtree(work / f"naive-{layers}", ignore_errors=True)
    for d in (f"hf-{layers}", f"mcore-{layers}", f"back-{layers}"):
        shutil.rmtree(work / d, ignore_errors=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows here too")
    a = ap.parse_args(argv)
    from tqdm import tqdm

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-convert-", dir=a.workdir) as tmp:
        for layers in tqdm(a.layers, desc="layer counts", file=sys.stderr):
            rows.append(bench_one(Path(tmp), layers, a.nproc, not a.no_naive))
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"}
    print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
