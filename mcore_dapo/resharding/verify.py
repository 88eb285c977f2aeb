"""Verification of a sync: the receiver's names and shapes before any write, checksums after.

* :func:`check_receiver` compares the plan (names and shapes the trainer will
  send) with what the receiver expects, and raises a one-line
  :class:`~mcore_dapo.errors.UserError` naming the first mismatched tensor. It
  runs before the first bucket, so a wrong receiver keeps its weights.
* :func:`checksum` is a bit-exact, position-weighted sum of a tensor's bits,
  computed on the tensor's own device in chunks (no host copy of the weights).
  The trainer computes it on each assembled tensor; the receiver recomputes it
  on what it holds after loading; :class:`ChecksumMismatch` names the first
  tensor that differs.
"""

from __future__ import annotations

from typing import Iterable

import torch

from mcore_dapo.errors import UserError

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK = 1 << 24
_MOD = 65521  # largest prime below 2**16: weights 1..65521 by position


class ChecksumMismatch(RuntimeError):
    """What the receiver holds differs from what the trainer sent."""


def checksum(t: torch.Tensor) -> int:
    """Sum over elements of ``bits(x_i) * (i % 65521 + 1)``, wrapping in int64. Same bits -> same value."""
    x = t.detach().contiguous().reshape(-1)
    if x.dtype not in _INT_OF_SIZE.values():
        x = x.view(_INT_OF_SIZE[x.element_size()])
    total = torch.zeros((), dtype=torch.int64, device=x.device)
    for lo in range(0, x.numel(), _CHUNK):
        c = x[lo:lo + _CHUNK].to(torch.int64)
        w = torch.arange(lo, lo + c.numel(), device=x.device, dtype=torch.int64) % _MOD + 1
        total += (c * w).sum()
    return int(total.item())


def _fmt(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_receiver(specs: Iterable[tuple[str, tuple[int, ...]]], expected: dict[str, tuple[int, ...]]) -> None:
    """Raise a one-line UserError at the first tensor whose name or shape the receiver does not expect."""
    sent = set()
    for name, shape in specs:
        sent.add(name)
        if name not in expected:
            raise UserError(
                f"tensor {name!r} {_fmt(shape)} sent by the trainer does not exist in the receiving model "
                "(wrong model or config?); nothing was written"
            )
        if tuple(expected[name]) != tuple(shape):
            raise UserError(
                f"tensor {name!r} has shape {_fmt(shape)} in the trainer but {_fmt(expected[name])} in the "
                "receiving model (wrong model or config?); nothing was written"
            )
    for name, shape in expected.items():
        if name not in sent:
            raise UserError(
                f"tensor {name!r} {_fmt(shape)} of the receiving model is not sent by the trainer "
                "(wrong model or config?); nothing was written"
            )


def compare_checksums(expected: dict[str, int], got: dict[str, int]) -> list[str]:
    """Names whose checksums differ (or are missing), in ``expected`` order."""
    return [n for n, s in expected.items() if got.get(n) != s]
