#!/usr/bin/env python
"""Benchmark a checkpoint of verl's trainer on the plugin's engine: save and load seconds and bytes.

A model of Qwen3-30B-A3B's width (hidden 2048, 32/4 heads of 128, experts of ffn 768, top-8, bf16, the
shipped configs/models/qwen3-30b-a3b config) with ``--layers`` layers, ``--experts`` experts and a vocabulary of
``--vocab`` tokens (the real 151936 and 128 experts need about 35 GB for the model, its fp32 gradients and
Adam state on 2 ranks), is trained one step through verl's worker calls
(:mod:`mcore_dapo.harness.reshard_resume` ``bench``), then ``save_checkpoint`` (HF weights through the checkpoint
bridge, the distributed optimizer in the reshardable format, RNG states; saved atomically) and
``load_checkpoint`` of it are timed. Printed: seconds, bytes by part, GB/s, and seconds per GB of model (bf16).

    python tools/bench_checkpoint.py --workdir DIR [--layers 2] [--experts 8] [--vocab 32768] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tools/bench_checkpoint.py")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--json", default=None)
    from mcore_dapo.bridge.layout import Layout

    Layout.add_args(ap, ("ep",), ep=2)
    a = ap.parse_args(argv)
    from mcore_dapo.errors import UserError, accepted
    from mcore_dapo.harness.reshard_resume import launch
    from mcore_dapo.harness.tiny import make_tiny_model

    try:
        if a.layers < 1:
            raise accepted("--layers", a.layers, "at least 1")
        if a.vocab < 1:
            raise accepted("--vocab", a.vocab, "at least 1")
        if a.experts < 8 or a.ep < 1 or a.experts % a.ep:
            raise UserError(f"--experts={a.experts} with --ep={a.ep} is not accepted: at least 8 experts (the "
                            "model's top-8), a number EP divides")
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
    t = time.perf_counter()
    r = launch("bench", model, work / "run", ep=a.ep, timeout=3000)
    r.update(wall_seconds=round(time.perf_counter() - t, 1), model_bytes=model_bytes,
             layers=a.layers, experts=a.experts, vocab=a.vocab, machine=f"{platform.machine()}, {_cores()} cores",
             date=time.strftime("%Y-%m-%d"))
    gb = model_bytes / 1e9
    r["save_s_per_model_gb"] = round(r["save_seconds"] / gb, 2)
    r["load_s_per_model_gb"] = round(r["load_seconds"] / gb, 2)
    r["checkpoint_bytes_per_model_byte"] = round(r["total_bytes"] / model_bytes, 2)
    r["save_gb_per_s"] = round(r["total_bytes"] / 1e9 / r["save_seconds"], 3)
    r["load_gb_per_s"] = round(r["total_bytes"] / 1e9 / r["load_seconds"], 3)
    text = json.dumps(r, indent=1)
    print(text)
    if a.json:  # written beside its place, then moved: never a half-written file
        out = Path(a.json)
        tmp = out.with_name(f".{out.name}.partial")
        tmp.write_text(text)
        tmp.replace(out)
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    sys.exit(main())
