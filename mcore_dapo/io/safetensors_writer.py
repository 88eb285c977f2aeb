"""Write a safetensors file tensor by tensor, without building the whole file in memory.

``safetensors.torch.save_file`` serialises the file into one buffer first (a second copy
of every tensor); here the header is computed from shapes, then each tensor's bytes are
written straight from its storage. The result is a standard safetensors file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
         torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
         torch.bool: "BOOL"}


def write_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> int:
    """Write ``tensors`` (in the given order) to ``path``; returns the bytes of tensor data."""
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors.values():
            f.write(memoryview(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return offset
