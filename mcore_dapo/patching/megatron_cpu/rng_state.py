"""``cpu.megatron.rng-state``: the RNG tracker's CUDA generator state is the CPU generator's."""

from __future__ import annotations

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.tensor_parallel.random"


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


@implements("cpu.megatron.rng-state")
def _rng_state(patch: Patcher) -> None:
    patch.replace(_get_rng_state, f"{MODULE}:_get_cuda_rng_state")
    patch.replace(_set_rng_state, f"{MODULE}:_set_cuda_rng_state")
