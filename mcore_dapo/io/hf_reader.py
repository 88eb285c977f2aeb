"""Lazy reader of an HF safetensors checkpoint (single file or sharded with an index).

Only the tensors asked for are read; nothing builds the HF model. Problems a
user can cause (missing shard, truncated file, index naming a missing tensor)
are :class:`UserError` with one line.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch

from mcore_dapo.errors import UserError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class HFReader:
    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        if not self.path.is_dir():
            raise UserError(f"HF checkpoint folder {str(path)!r} does not exist")
        index = self.path / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise UserError(f"{index} is not a valid safetensors index ({e})") from None
        elif (self.path / SINGLE).is_file():
            weight_map = None
        else:
            raise UserError(f"no {INDEX} or {SINGLE} in {str(path)!r}: expected an HF safetensors checkpoint")
        self._stack = ExitStack()
        self._files: dict[str, object] = {}
        self._safe_open = safe_open
        if weight_map is None:
            handle = self._open(SINGLE)
            weight_map = {k: SINGLE for k in handle.keys()}
        else:
            for f in sorted(set(weight_map.values())):
                if not (self.path / f).is_file():
                    raise UserError(f"shard {f!r} named in {INDEX} is missing from {str(path)!r}")
        self.weight_map: dict[str, str] = weight_map

    def _open(self, fname: str):
        if fname not in self._files:
            try:
                self._files[fname] = self._stack.enter_context(
                    self._safe_open(str(self.path / fname), framework="pt", device="cpu")
                )
            except Exception as e:  # safetensors raises its own error types for bad headers
                raise UserError(f"cannot read {self.path / fname}: {e} (truncated or not safetensors?)") from None
        return self._files[fname]

    def keys(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def _handle(self, name: str):
        try:
            fname = self.weight_map[name]
        except KeyError:
            raise UserError(f"tensor {name!r} is not in the checkpoint {str(self.path)!r}") from None
        return self._open(fname)

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._handle(name).get_tensor(name)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"cannot read tensor {name!r} from {self.path / self.weight_map[name]}: {e}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._handle(name).get_slice(name).get_dtype()

    def close(self) -> None:
        self._stack.close()
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
