#!/usr/bin/env python
"""Benchmark a checkpoint of verl's trainer on the plugin's engine: how long training is blocked, how long until
the checkpoint is complete, against the disk bound measured in the same run; load seconds and memory.

A model of Qwen3-30B-A3B's width (hidden 2048, 32/4 heads of 128, experts of ffn 768, top-8, bf16, the
shipped configs/models/qwen3-30b-a3b config) with ``--layers`` layers, ``--experts`` experts and a vocabulary of
``--vocab`` tokens (the real 151936 and 128 experts need about 35 GB for the model, its fp32 gradients and
Adam state on 2 ranks), is trained one step through verl's worker calls on each of ``--nproc`` rank counts (EP
as large as divides the experts and the ranks), then saved as the launch scripts save it
(``checkpoint.async_save=True``; ``--sync``: as verl saves by default) and loaded back
(:func:`mcore_dapo_checks.reshard_resume.bench_run`). Printed per rank count: ``blocked_s`` (the save call,
the slowest rank), ``persisted_s`` (until the checkpoint is in place with its record), ``disk_bound_s`` (every
rank writing its share of the same bytes with plain writes and fsync, at once, in the same run), their ratio,
``load_s``, each rank's resident memory before and at its peak during the load against its share of the
checkpoint, and ``hf_writer_ranks`` (how many ranks wrote HF shards).

    python tools/bench_checkpoint.py --workdir DIR [--nproc 2 4] [--layers 2] [--experts 8] [--vocab 32768]
                                     [--sync] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench_checkpoint.py")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--sync", action="store_true", help="save synchronously (verl's default) instead")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from mcore_dapo.errors import UserError, accepted
    from mcore_dapo_checks.reshard_resume import ASYNC, launch
    from mcore_dapo_checks.tiny import make_tiny_model

    try:
        if a.layers < 1:
            raise accepted("--layers", a.layers, "at least 1")
        if a.vocab < 1:
            raise accepted("--vocab", a.vocab, "at least 1")
        if a.experts < 8:
            raise accepted("--experts", a.experts, "at least 8 (the model's top-8)")
        bad = [n for n in a.nproc if n < 1]
        if bad:
            raise accepted("--nproc", bad[0], "rank counts of at least 1")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    work = Path(a.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    raw = json.loads((REPO / "configs/models/qwen3-30b-a3b/config.json").read_text())
    keep = {k: v for k, v in raw.items() if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")}
    keep.update(num_hidden_layers=a.layers, num_experts=a.experts, vocab_size=a.vocab, initializer_range=0.02)
    model = make_tiny_model(work / "model", dtype="bfloat16", **keep)
    model_bytes = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    runs = []
    for n in a.nproc:
        t = time.perf_counter()
        r = launch("bench", model, work / f"run-{n}", ep=math.gcd(a.experts, n), nproc=n, timeout=3000,
                   extra=() if a.sync else ("--set", ASYNC))
        r.pop("returncode", None)
        r["wall_s"] = round(time.perf_counter() - t, 1)
        r["disk_bound_over_persisted"] = round(r["disk_bound_s"] / r["persisted_s"], 3)
        r["save_s_per_model_gb"] = round(r["persisted_s"] / (model_bytes / 1e9), 2)
        r["load_s_per_model_gb"] = round(r["load_s"] / (model_bytes / 1e9), 2)
        r["load_rss_increase_mb"] = [p - b for p, b in zip(r["load_rss_peak_mb"], r["load_rss_before_mb"])]
        runs.append(r)
        print(f"{n} ranks ({r['layout']}): blocked {r['blocked_s']} s, persisted {r['persisted_s']} s, disk bound "
              f"{r['disk_bound_s']} s ({r['disk_bound_over_persisted']}), load {r['load_s']} s, HF writer ranks "
              f"{r['hf_writer_ranks']}", file=sys.stderr)
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {_cores()} cores",
           "model_bytes": model_bytes, "layers": a.layers, "experts": a.experts, "vocab": a.vocab,
           "async_save": not a.sync, "runs": runs}
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:  # written beside its place, then moved: never a half-written file
        path = Path(a.json)
        tmp = path.with_name(f".{path.name}.partial")
        tmp.write_text(text)
        tmp.replace(path)
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
