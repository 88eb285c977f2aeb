"""``cpu.megatron.dist-ckpt-exchange``: while the two exchange functions of fully parallel dist-checkpoint
loading run, ``Tensor.cuda()`` returns the tensor itself; restored when they return."""

from __future__ import annotations

import contextlib

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.dist_checkpointing.exchange_utils"


@contextlib.contextmanager
def _tensor_cuda_stays_on_cpu():
    original = torch.Tensor.cuda

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self

    torch.Tensor.cuda = cuda
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def _on_cpu(original):
    def exchange(*args, **kwargs):
        with _tensor_cuda_stays_on_cpu():
            return original(*args, **kwargs)

    return exchange


@implements("cpu.megatron.dist-ckpt-exchange")
def _dist_ckpt_exchange(patch: Patcher) -> None:
    patch.wrap(_on_cpu, f"{MODULE}:exchange_loaded_tensors_gather_rounds")
    patch.wrap(_on_cpu, f"{MODULE}:exchange_loaded_tensors_broadcast")
