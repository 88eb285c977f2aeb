"""Lazy reader of an HF safetensors checkpoint (single file or sharded with an index).

Only the tensors asked for are read, with plain positioned reads into fresh tensors: no
memory map, so a process's resident memory holds the tensors it keeps and nothing of the
files it has read through. Nothing builds the HF model. Problems a user can cause (missing
shard, truncated file, index naming a missing tensor) are :class:`UserError` with one line.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from mcore_dapo.errors import UserError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

DTYPES = {
    "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorInfo:
    file: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, checked against the file's size."""
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
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{path} is not a safetensors file (unreadable header)") from None
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, meta in header.items():
        lo, hi = meta["data_offsets"]
        if base + hi > size:
            raise UserError(f"{path} is truncated: {size} bytes, tensor {name!r} needs {base + hi}")
        out[name] = TensorInfo(path.name, meta["dtype"], tuple(meta["shape"]), base + lo, base + hi)
    return out


class HFReader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise UserError(f"HF checkpoint folder {str(path)!r} does not exist")
        index = self.path / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise UserError(f"{index} is not a valid safetensors index ({e})") from None
            files = sorted(set(weight_map.values()))
            for f in files:
                if not (self.path / f).is_file():
                    raise UserError(f"shard {f!r} named in {INDEX} is missing from {str(path)!r}")
        elif (self.path / SINGLE).is_file():
            weight_map, files = None, [SINGLE]
        else:
            raise UserError(f"no {INDEX} or {SINGLE} in {str(path)!r}: expected an HF safetensors checkpoint")
        self.tensors: dict[str, TensorInfo] = {}
        for f in files:
            self.tensors.update(read_header(self.path / f))
        if weight_map is not None:
            for name, f in weight_map.items():
                if name not in self.tensors or self.tensors[name].file != f:
                    raise UserError(f"{INDEX} places {name!r} in {f!r}, which does not hold it")
        self.weight_map = {n: t.file for n, t in self.tensors.items()}
        self._fds: dict[str, int] = {}

    def keys(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise UserError(f"tensor {name!r} is not in the checkpoint {str(self.path)!r}") from None

    def _fd(self, fname: str) -> int:
        if fname not in self._fds:
            self._fds[fname] = os.open(self.path / fname, os.O_RDONLY)
        return self._fds[fname]

    def get(self, name: str) -> torch.Tensor:
        ti = self.info(name)
        if ti.dtype not in DTYPES:
            raise UserError(f"tensor {name!r} has dtype {ti.dtype}, which is not supported")
        buf = torch.empty(ti.end - ti.start, dtype=torch.uint8)
        view, fd, pos = memoryview(buf.numpy()), self._fd(ti.file), ti.start
        while view.nbytes:
            n = os.preadv(fd, [view], pos)
            if n <= 0:
                raise UserError(f"cannot read tensor {name!r} from {self.path / ti.file}: file ended early")
            view, pos = view[n:], pos + n
        return buf.view(DTYPES[ti.dtype]).reshape(ti.shape)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name).shape

    def dtype(self, name: str) -> str:
        return self.info(name).dtype

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
