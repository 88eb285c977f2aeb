"""HF checkpoint shards: ``(hf_name, tensor)`` into safetensors part files, then HF names and an index.

One writer for every HF checkpoint the project writes (``mcore-convert mcore2hf``, whose ranks
each write their own parts, and the verl engine's HF checkpoints, written by rank 0):
:class:`ShardWriter` fills part files up to a size; :func:`finalize_shards` renames the parts of
all ranks to ``model-0000i-of-0000n.safetensors`` in HF tensor order and writes
``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mcore_dapo.io.hf_reader import INDEX
from mcore_dapo.io.safetensors_writer import write_safetensors

SHARD_BYTES = 4 << 30


class ShardWriter:
    """Tensors into ``{prefix}-{n:05d}.safetensors`` files of at most ``shard_bytes`` (one bigger tensor
    gets a file of its own). :attr:`parts` lists each file with the names it holds."""

    def __init__(self, folder: Path, shard_bytes: int = SHARD_BYTES, prefix: str = "part"):
        self.folder, self.shard_bytes, self.prefix = Path(folder), shard_bytes, prefix
        self.parts: list[dict] = []
        self.bytes_written = 0
        self._current: dict[str, torch.Tensor] = {}
        self._size = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if self._size and self._size + nbytes > self.shard_bytes:
            self.flush()
        self._current[name] = t
        self._size += nbytes
        self.bytes_written += nbytes

    def flush(self) -> None:
        if self._current:
            name = f"{self.prefix}-{len(self.parts):05d}.safetensors"
            write_safetensors(self.folder / name, self._current, metadata={"format": "pt"})
            self.parts.append({"file": name, "names": list(self._current)})
            self._current, self._size = {}, 0


def finalize_shards(folder: Path, parts: list[dict], order: list[str]) -> dict:
    """Rename the part files to HF shard names (in HF tensor ``order``) and write the index."""
    from mcore_dapo.io.hf_reader import read_header

    pos = {n: i for i, n in enumerate(order)}
    parts = sorted(parts, key=lambda p: min(pos[n] for n in p["names"]))
    weight_map, total = {}, 0
    for i, p in enumerate(parts):
        name = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        (folder / p["file"]).rename(folder / name)
        for k, info in read_header(folder / name).items():
            weight_map[k] = name
            total += info.end - info.start
    index = {"metadata": {"total_size": total},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map, key=lambda n: pos[n])}}
    (folder / INDEX).write_text(json.dumps(index, indent=2))
    return index


def write_hf_shards(weights, folder: Path, shard_bytes: int = SHARD_BYTES) -> dict:
    """One process writes every ``(hf_name, tensor)`` of ``weights`` as a finished HF checkpoint's shards."""
    writer, order = ShardWriter(folder, shard_bytes), []
    for name, t in weights:
        writer.add(name, t.detach().clone())  # exporters reuse their buffers
        order.append(name)
    writer.flush()
    return finalize_shards(folder, writer.parts, order)
