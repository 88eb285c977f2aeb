"""``mcore-convert verify``: a torch_dist checkpoint against its HF source.

1. the manifest: finished, same config.json as the HF folder, the model's tensor count;
2. checksums: every HF tensor's crc32 equals the one recorded when the checkpoint was written
   (so the checkpoint holds exactly this HF checkpoint's weights);
3. logits: the checkpoint loaded by Megatron under a layout (by default the one it was written
   with) against the HF transformers model on fixed prompts; max and mean |difference| and
   top-1 agreement, failing past a tolerance that depends on the dtype.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

from mcore_dapo import versions
from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.io import output
from mcore_dapo.errors import UserError
from mcore_dapo.runtime.launch import LaunchError, torchrun

# (max |dlogit|, minimum top-1 agreement) per dtype
TOLERANCE = {"fp32": (1e-3, 1.0), "bf16": (0.5, 0.9), "fp16": (0.25, 0.95)}
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def verify_checksums(hf_path: Path, manifest: dict, progress: bool = False) -> list[str]:
    from tqdm import tqdm

    from mcore_dapo.io.hf_reader import HFReader

    bad = []
    with HFReader(hf_path) as reader:
        for name, crc in tqdm(sorted(manifest["checksums"].items()), desc="checksums", disable=not progress,
                              file=sys.stderr):
            if name not in reader or output.checksum(reader.get(name)) != crc:
                bad.append(name)
    return bad


def verify(hf_path: str | Path, mcore_path: str | Path, layout: Layout | None = None, *, nproc: int | None = None,
           batch: int = 4, seq: int = 32, progress: bool = False, checksums: bool = True) -> dict:
    versions.check_stack()
    hf_path, mcore_path = Path(hf_path), Path(mcore_path)
    manifest = output.read_manifest(mcore_path)
    bridge = Bridge.from_hf(hf_path)
    problems = []
    sha = hashlib.sha256((hf_path / "config.json").read_bytes()).hexdigest()
    if manifest["source"]["config_sha256"] != sha:
        problems.append("config.json differs from the one the checkpoint was converted from")
    if manifest["tensor_count"] != len(bridge.hf_names()):
        problems.append(f"manifest lists {manifest['tensor_count']} tensors, the model has {len(bridge.hf_names())}")
    bad = verify_checksums(hf_path, manifest, progress) if checksums else []
    if bad:
        problems.append(f"{len(bad)} tensors differ from the HF checkpoint (first: {bad[0]})")
    if layout is None:
        lw = manifest["layout_written"]
        layout = Layout(tp=lw["tp"], pp=lw["pp"], ep=lw["ep"], etp=lw["etp"])
    Bridge(bridge.cfg, layout)  # validates the layout for this model
    n = nproc or layout.min_world_size()
    layout.validate(world_size=n)
    if seq % layout.tp:
        raise UserError(f"seq={seq} is not accepted with tp={layout.tp}: a multiple of TP is")
    dtype = manifest["dtype"]
    dp = layout.dp(n)  # at least one sequence for each data-parallel rank, the same number each
    batch = -(-max(batch, dp) // dp) * dp
    with tempfile.TemporaryDirectory(prefix="mcore-dapo-verify-") as tmp:
        ref = Path(tmp) / "ref.pt"
        subprocess.run([sys.executable, "-m", "mcore_dapo.convert.hf_reference", str(hf_path), str(ref),
                        "--batch", str(batch), "--seq", str(seq), "--dtype", TORCH_DTYPE[dtype]],
                       check=True, capture_output=True, text=True)
        args = ["--hf-path", str(hf_path), "--reference", str(ref), "--mcore-path", str(mcore_path),
                *layout.to_argv(), "--dtype", dtype]
        try:
            r = torchrun("mcore_dapo.convert.forward_check", args, n, timeout=None)
        except LaunchError as e:
            raise UserError(f"loading {str(mcore_path)!r} under {layout.describe()} failed: "
                            f"{str(e).splitlines()[-1]}") from None
    max_tol, top1_tol = TOLERANCE[dtype]
    if r["max_abs_diff"] > max_tol:
        problems.append(f"max |dlogit| {r['max_abs_diff']:.3g} exceeds {max_tol} for {dtype}")
    if r["top1_agreement"] < top1_tol:
        problems.append(f"top-1 agreement {r['top1_agreement']:.3f} is below {top1_tol} for {dtype}")
    return {
        "hf_path": str(hf_path), "mcore_path": str(mcore_path), "layout": layout.describe(), "nproc": n,
        "dtype": dtype, "key_layout": r["key_layout"], "tensors_checked": 0 if not checksums else len(manifest["checksums"]),
        "checksum_mismatches": len(bad), "max_abs_diff": r["max_abs_diff"], "mean_abs_diff": r["mean_abs_diff"],
        "top1_agreement": r["top1_agreement"], "tolerance": {"max_abs_diff": max_tol, "top1": top1_tol},
        "problems": problems, "passed": not problems,
    }
