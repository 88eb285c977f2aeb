"""``mcore-convert``: hf2mcore, mcore2hf, verify."""

from __future__ import annotations

import argparse
import json
import sys

from mcore_dapo.bridge.layout import LAYOUT_FLAGS, Layout
from mcore_dapo.cli import user_errors


def _layout(a):
    return Layout.from_args(a)


def _hf2mcore(a) -> int:
    from mcore_dapo.convert.api import hf2mcore

    m = hf2mcore(a.hf_path, a.out, _layout(a), nproc=a.nproc, dtype=a.dtype, overwrite=a.overwrite,
                 progress=not a.json)
    summary = {k: m[k] for k in ("layout_written", "nproc", "dtype", "tensor_count", "seconds")}
    summary["out"] = a.out
    print(json.dumps(summary) if a.json else
          f"wrote {a.out}: {m['tensor_count']} HF tensors as torch_dist, written under "
          f"TP{m['layout_written']['tp']} PP{m['layout_written']['pp']} EP{m['layout_written']['ep']} "
          f"ETP{m['layout_written']['etp']} by {m['nproc']} processes ({m['dtype']}, {m['seconds']:.1f} s); "
          "loads under any layout")
    return 0


def _mcore2hf(a) -> int:
    from mcore_dapo.convert.api import mcore2hf

    r = mcore2hf(a.mcore_path, a.out, hf_config=a.hf_config, nproc=a.nproc, overwrite=a.overwrite,
                 progress=not a.json)
    print(json.dumps(r) if a.json else
          f"wrote {a.out}: {r['tensors']} tensors, {r['bytes'] / 1e9:.3f} GB, read under {r['layout_read']} "
          f"in {r['seconds']:.1f} s; " + ("checksums equal the source's" if r["checked_against_manifest"]
                                           and not r["checksum_mismatches"] else
                                           f"{len(r['checksum_mismatches'])} tensors differ from the source "
                                           "(trained weights?)" if r["checked_against_manifest"] else
                                           "no manifest to compare with"))
    return 0


def _verify(a) -> int:
    from mcore_dapo.convert.verify import verify

    layout = _layout(a) if any(getattr(a, f) is not None for f in LAYOUT_FLAGS) else None
    r = verify(a.hf_path, a.mcore_path, layout, nproc=a.nproc, progress=not a.json)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['mcore_path']} vs {r['hf_path']} under {r['layout']} ({r['dtype']}):")
        print(f"  checksums: {r['tensors_checked'] - r['checksum_mismatches']}/{r['tensors_checked']} equal")
        print(f"  logits: max |d| {r['max_abs_diff']:.3g}, mean |d| {r['mean_abs_diff']:.3g}, "
              f"top-1 agreement {r['top1_agreement']:.3f} (tolerance {r['tolerance']['max_abs_diff']})")
        print("  PASSED" if r["passed"] else "  FAILED: " + "; ".join(r["problems"]))
    return 0 if r["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mcore-convert", description="HF <-> Megatron torch_dist checkpoints")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("hf2mcore", help="HF safetensors -> Megatron torch_dist (loads under any layout)")
    p.add_argument("--hf-path", required=True)
    p.add_argument("--out", required=True)
    Layout.add_args(p)
    p.add_argument("--nproc", type=int, default=None, help="processes (default: the layout's minimum)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_hf2mcore)
    p = sub.add_parser("mcore2hf", help="Megatron torch_dist -> HF safetensors shards + index")
    p.add_argument("--mcore-path", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hf-config", default=None, help="folder with config.json (and tokenizer files to copy)")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_mcore2hf)
    p = sub.add_parser("verify", help="compare a torch_dist checkpoint with its HF source")
    p.add_argument("--hf-path", required=True)
    p.add_argument("--mcore-path", required=True)
    Layout.add_args(p, unset=True)  # the layout the checkpoint was written under, unless given
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_verify)
    return ap


@user_errors
def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
