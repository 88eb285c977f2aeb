"""The conversions as library functions: checks first, workers under torchrun, output moved into place last."""

from __future__ import annotations

import datetime
import hashlib
import platform
from pathlib import Path

from mcore_dapo import versions
from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.io import output
from mcore_dapo.convert.hf2mcore import copy_hf_side_files
from mcore_dapo.convert.preflight import check_hf_checkpoint
from mcore_dapo.errors import UserError
from mcore_dapo.runtime.launch import LaunchError, torchrun

DTYPES = ("auto", "bf16", "fp16", "fp32")


def _nproc(layout: Layout, nproc: int | None) -> int:
    n = nproc or layout.min_world_size()
    if n < 1:
        raise UserError(f"nproc={n} is not accepted: a positive integer is")
    layout.validate(world_size=n)
    return n


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _workers(name: str, args: list[str], nproc: int, progress: bool) -> dict:
    """Run the ``name`` conversion worker in ``nproc`` processes; its failure is one line."""
    try:
        return torchrun(f"mcore_dapo.convert.{name}", [*args, *(["--progress"] if progress else [])], nproc,
                        timeout=None, stream=progress)
    except LaunchError as e:
        raise UserError(f"{name} failed: {str(e).splitlines()[0]}") from None


def hf2mcore(hf_path: str | Path, out: str | Path, layout: Layout = Layout(), *, nproc: int | None = None,
             dtype: str = "auto", overwrite: bool = False, progress: bool = True) -> dict:
    """Convert an HF checkpoint folder to a torch_dist checkpoint at ``out``; returns the manifest."""
    versions.check_stack()
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r} is not accepted: accepted are {', '.join(DTYPES)}")
    if layout.vpp or layout.cp > 1:
        raise UserError(f"{layout.describe()} is not accepted for writing: hf2mcore writes under TP, PP, EP and ETP "
                        "(its torch_dist checkpoint loads under any layout, VPP and CP included)")
    hf_path = Path(hf_path)
    bridge = Bridge.from_hf(hf_path, layout)
    out = output.check_output(out, overwrite)
    summary = check_hf_checkpoint(hf_path, bridge)
    n = _nproc(layout, nproc)
    with output.staged(out, overwrite) as partial:
        args = ["--hf-path", str(hf_path), "--partial", str(partial), *layout.to_argv(), "--dtype", dtype]
        r = _workers("hf2mcore", args, n, progress)
        copy_hf_side_files(hf_path, partial / output.HF_CONFIG_DIR)
        manifest = {
            "kind": "megatron-torch_dist",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "written_by": output.written_by(),
            "source": {"hf_path": str(hf_path.absolute()), "config_sha256": _sha256(hf_path / "config.json"),
                       "files": summary["files"], "bytes": summary["bytes"]},
            "layout_written": layout.as_dict(),
            "nproc": n,
            "dtype": r["dtype"],
            "model_type": bridge.cfg.model_type,
            "tensor_count": r["tensors"],
            "key_layout": r["key_layout"],
            "checksums": r["checksums"],
            "seconds": r["seconds"],
            "peak_rss_mb": r["peak_rss_mb"],
        }
        output.write_manifest(partial, manifest)
    return manifest


def mcore2hf(mcore_path: str | Path, out: str | Path, *, hf_config: str | Path | None = None,
             nproc: int = 1, overwrite: bool = False, progress: bool = True, dtype: str | None = None) -> dict:
    """Convert a torch_dist checkpoint back to HF safetensors at ``out``; returns a summary."""
    versions.check_stack()
    from mcore_dapo.io.dist_ckpt import checkpoint_dtype
    from mcore_dapo.io.hf_shards import finalize_shards

    mcore_path = Path(mcore_path)
    manifest = None
    if (mcore_path / output.MANIFEST).is_file() or hf_config is None:
        manifest = output.read_manifest(mcore_path)
    config_dir = Path(hf_config) if hf_config else mcore_path / output.HF_CONFIG_DIR
    bridge = Bridge.from_hf(config_dir)
    # a checkpoint written by another tool (no manifest) is read in the dtype it holds
    dtype = dtype or (manifest["dtype"] if manifest else checkpoint_dtype(mcore_path))
    out = output.check_output(out, overwrite)
    if nproc < 1:
        raise UserError(f"nproc={nproc} is not accepted: a positive integer is")
    with output.staged(out, overwrite) as partial:
        args = ["--mcore-path", str(mcore_path), "--hf-config", str(config_dir), "--partial", str(partial),
                "--dtype", dtype]
        r = _workers("mcore2hf", args, nproc, progress)
        expected = bridge.hf_names()
        if set(r["checksums"]) != set(expected):
            raise RuntimeError(f"mcore2hf wrote {len(r['checksums'])} tensors, the model has {len(expected)}")
        mismatched = []
        if manifest is not None:
            mismatched = [k for k, v in manifest["checksums"].items() if r["checksums"].get(k) != v]
        finalize_shards(partial, r["parts"], list(bridge.hf_shapes()))
        copy_hf_side_files(config_dir, partial)
    return {"tensors": len(r["checksums"]), "bytes": r["bytes_written"], "layout_read": r["layout"],
            "key_layout": r["key_layout"],
            "seconds": r["seconds"], "peak_rss_mb": r["peak_rss_mb"],
            "checked_against_manifest": manifest is not None, "checksum_mismatches": mismatched}
