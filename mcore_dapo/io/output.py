"""Outputs that appear only when complete, and the manifest a finished checkpoint carries.

A conversion writes into a hidden sibling folder ``.<name>.partial-<id>``; only when every
rank has finished is the manifest written there and the folder renamed to its final name.
An interrupted run leaves at most a ``.partial`` folder, never a finished-looking checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
import zlib
from pathlib import Path

from mcore_dapo.errors import UserError

MANIFEST = "mcore_dapo_manifest.json"
FORMAT = "mcore-dapo/torch_dist/1"
HF_CONFIG_DIR = "hf_config"


def check_output(out: str | Path, overwrite: bool) -> Path:
    """Refuse an existing output (unless overwrite) or an unwritable parent; return the absolute path."""
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        raise UserError(f"output {str(out)!r} already exists: pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise UserError(f"output {str(out)!r} exists and is not a folder")
    parent = out.parent
    if not parent.is_dir():
        raise UserError(f"output folder's parent {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output folder {str(out)!r} is not writable (no write permission on {str(parent)!r})")
    return out


def partial_dir(out: Path, run_id: str | None = None) -> Path:
    return out.parent / f".{out.name}.partial-{run_id or uuid.uuid4().hex[:12]}"


def finish(partial: Path, out: Path, overwrite: bool) -> None:
    """Move a complete ``partial`` folder to ``out`` (replacing it when ``overwrite``)."""
    old = None
    if out.exists():
        if not overwrite:
            raise UserError(f"output {str(out)!r} appeared while converting: pass --overwrite to replace it")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    partial.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def discard(partial: Path) -> None:
    shutil.rmtree(partial, ignore_errors=True)


@contextlib.contextmanager
def staged(out: Path, overwrite: bool):
    """Yield a fresh ``.partial`` folder; move it to ``out`` when the block completes, else remove it."""
    partial = partial_dir(out)
    partial.mkdir()
    try:
        yield partial
        finish(partial, out, overwrite)
    except BaseException:
        discard(partial)
        raise


def write_text_atomically(path: str | Path, text: str, mode: int | None = None) -> None:
    """``text`` into ``path`` through a hidden sibling, flushed to disk and renamed over it: a reader, or a crash,
    sees the old content or the new, never half (a manifest, verl's tracker, a migrated script). ``mode``: the new
    file's permissions. A failed write removes the sibling and raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def checksum(t) -> str:
    """crc32 of the tensor's bytes (dtype and layout as stored)."""
    import torch

    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def write_manifest(folder: Path, manifest: dict) -> None:
    write_text_atomically(folder / MANIFEST, json.dumps({"format": FORMAT, **manifest}, indent=1, sort_keys=True))


def read_manifest(folder: str | Path) -> dict:
    p = Path(folder) / MANIFEST
    if not Path(folder).is_dir():
        raise UserError(f"Megatron checkpoint folder {str(folder)!r} does not exist")
    if not p.is_file():
        raise UserError(
            f"{str(folder)!r} has no {MANIFEST}: not a finished mcore-dapo checkpoint "
            "(an interrupted conversion, or written by another tool)"
        )
    m = json.loads(p.read_text())
    if m.get("format") != FORMAT:
        raise UserError(f"{p} has format {m.get('format')!r}: accepted is {FORMAT!r}")
    check_writer(folder, m)
    return m


def written_by() -> dict:
    """The versions a manifest records as the checkpoint's writer."""
    from mcore_dapo import __version__, versions

    return {"mcore_dapo": __version__, **{k: versions.installed(k) for k in versions.SUPPORTED}}


def check_writer(folder, manifest: dict) -> None:
    """A checkpoint written under a megatron-core outside the supported range is refused in one line
    (manifests without ``written_by`` predate the record and were written under megatron-core 0.16.1)."""
    from mcore_dapo import versions

    v = (manifest.get("written_by") or {}).get("megatron-core")
    if v and not versions.is_supported("megatron-core", v):
        raise UserError(f"{str(folder)!r} was written by megatron-core {v}: checkpoints of megatron-core"
                        f"{versions.supported_range('megatron-core')} are read")
