"""Checks of an HF checkpoint before any process starts: files whole, names and shapes as the config says."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mcore_dapo.bridge import Bridge
from mcore_dapo.bridge.qwen3 import hf_shapes
from mcore_dapo.errors import UserError
from mcore_dapo.io.hf_reader import INDEX, SINGLE, HFReader


def _header(path: Path) -> tuple[dict, int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise UserError(f"{path} is truncated: {size} bytes, too short for a safetensors header")
        n = struct.unpack("<Q", raw)[0]
        if 8 + n > size:
            raise UserError(f"{path} is truncated: its header says {n} bytes, the file has {size}")
        try:
            header = json.loads(f.read(n))
        except json.JSONDecodeError:
            raise UserError(f"{path} is not a safetensors file (unreadable header)") from None
    header.pop("__metadata__", None)
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if 8 + n + end > size:
        raise UserError(f"{path} is truncated: {size} bytes, its tensors need {8 + n + end}")
    return header, size


def check_hf_checkpoint(path: str | Path, bridge: Bridge) -> dict:
    """Raise a one-line UserError for a missing shard, a truncated file, a missing or misshapen tensor.

    Returns a summary (tensors, bytes, dtypes). Reads only the files' headers.
    """
    path = Path(path)
    if (path / SINGLE).is_file() and not (path / INDEX).is_file():
        files = [SINGLE]  # header checked below before safetensors opens it
    else:
        with HFReader(path) as reader:  # index: validates it and that its shards exist
            files = sorted(set(reader.weight_map.values()))
    shapes, dtypes, total = {}, set(), 0
    for f in files:
        header, size = _header(path / f)
        total += size
        for name, meta in header.items():
            shapes[name] = tuple(meta["shape"])
            dtypes.add(meta["dtype"])
    expected = hf_shapes(bridge.cfg)
    for name, shape in expected.items():
        if name not in shapes:
            raise UserError(f"tensor {name!r} that config.json implies is missing from the checkpoint {str(path)!r}")
        if shapes[name] != shape:
            raise UserError(
                f"tensor {name!r} has shape {list(shapes[name])} in the checkpoint, config.json implies {list(shape)}"
            )
    return {"files": len(files), "tensors": len(expected), "bytes": total, "dtypes": sorted(dtypes)}
