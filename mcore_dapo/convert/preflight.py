"""Checks of an HF checkpoint before any process starts: files whole, names and shapes as the config says."""

from __future__ import annotations

from pathlib import Path

from mcore_dapo.bridge import Bridge
from mcore_dapo.errors import UserError
from mcore_dapo.io.hf_reader import HFReader


def check_hf_checkpoint(path: str | Path, bridge: Bridge) -> dict:
    """Raise a one-line UserError for a missing shard, a truncated file, a missing or misshapen tensor.

    Returns a summary (files, tensors, bytes, dtypes). Reads only the files' headers.
    """
    path = Path(path)
    with HFReader(path) as reader:  # checks the index, the shards' presence and their sizes
        tensors = reader.tensors
    for name, shape in bridge.hf_shapes().items():
        if name not in tensors:
            raise UserError(f"tensor {name!r} that config.json implies is missing from the checkpoint {str(path)!r}")
        if tensors[name].shape != shape:
            raise UserError(
                f"tensor {name!r} has shape {list(tensors[name].shape)} in the checkpoint, "
                f"config.json implies {list(shape)}"
            )
    files = {t.file for t in tensors.values()}
    return {"files": len(files), "tensors": len(tensors),
            "bytes": sum((path / f).stat().st_size for f in files),
            "dtypes": sorted({t.dtype for t in tensors.values()})}
