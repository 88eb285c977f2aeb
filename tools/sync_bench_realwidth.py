"""Weight-sync benchmark on Qwen3-30B-A3B's real widths with few layers.

Generates (once, in --workdir) a random bf16 checkpoint with the shipped
Qwen3-30B-A3B config (hidden 2048, 128 experts of ffn 768, 32/4 heads of 128,
vocab 151936) but only --layers layers, then runs ``mcore-dapo sync-bench`` on
it; every argument after ``--`` goes to sync-bench::

    python tools/sync_bench_realwidth.py --layers 1 --workdir WORK -- --ep 2 --bucket-mb 1024

One layer is about 2.5 GB in bf16 (embedding and output layer 1.24 GB, the 128
experts 1.21 GB); each further layer adds about 1.23 GB. PP2 needs two layers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "models" / "qwen3-30b-a3b" / "config.json"


def realwidth_checkpoint(out: Path, layers: int) -> Path:
    """A seeded random checkpoint of the real config with ``layers`` layers (kept if already there)."""
    from mcore_dapo_checks.tiny import TINY_MOE, make_tiny_model

    if (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file():
        have = json.loads((out / "config.json").read_text()).get("num_hidden_layers")
        if have == layers:
            return out
    real = json.loads(CONFIG.read_text())
    overrides = {k: real[k] for k in TINY_MOE if k in real and k not in ("model_type", "architectures")}
    overrides["num_hidden_layers"] = layers
    print(f"writing a {layers}-layer real-width checkpoint to {out} ...", file=sys.stderr)
    return make_tiny_model(out, seed=0, dtype="bfloat16", **overrides)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="keep the generated checkpoint here (default: a temporary folder)")
    a = ap.parse_args(own)
    if a.layers < 1:
        ap.error(f"--layers={a.layers} is not accepted: at least 1")

    with tempfile.TemporaryDirectory(prefix="realwidth-") as tmp:
        out = Path(a.workdir) if a.workdir else Path(tmp)
        ckpt = realwidth_checkpoint(out / f"qwen3-30b-a3b-{a.layers}layer", a.layers)
        return sync_bench(["--hf-path", str(ckpt), *rest])


def sync_bench(argv: list[str]) -> int:
    """``mcore-dapo sync-bench ARGV`` (its own parser, so the tool works whatever else the CLI has)."""
    from mcore_dapo.cli import user_errors
    from mcore_dapo_checks.cli.sync_bench import add_commands

    ap = argparse.ArgumentParser(prog="sync_bench_realwidth.py --")
    add_commands(ap.add_subparsers(dest="cmd", required=True))
    return user_errors(lambda: (lambda a: a.fn(a))(ap.parse_args(["sync-bench", *argv])))()


if __name__ == "__main__":
    sys.exit(main())
