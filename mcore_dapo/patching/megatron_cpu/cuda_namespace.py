"""``torch.cuda`` as Megatron's modules see it on the CPU (part of ``cpu.megatron.torch-cuda-namespace``)."""

from __future__ import annotations

import contextlib

import torch


class _Stream:
    """Stand-in for torch.cuda.Stream / Event on the CPU: work is already ordered."""

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return self

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0


_STREAM = _Stream()


class _CpuRandom:
    get_rng_state = staticmethod(lambda device="cuda": torch.get_rng_state())
    set_rng_state = staticmethod(lambda new_state, device="cuda": torch.set_rng_state(new_state))
    manual_seed = staticmethod(lambda seed: torch.manual_seed(seed))
    manual_seed_all = staticmethod(lambda seed: torch.manual_seed(seed))


class CpuCuda:
    """``torch.cuda`` as Megatron's modules see it on the CPU."""

    random = _CpuRandom
    get_rng_state = staticmethod(_CpuRandom.get_rng_state)
    set_rng_state = staticmethod(_CpuRandom.set_rng_state)
    manual_seed = staticmethod(_CpuRandom.manual_seed)
    manual_seed_all = staticmethod(_CpuRandom.manual_seed_all)
    Stream = _Stream
    Event = _Stream

    @staticmethod
    def current_device():
        return torch.device("cpu")

    @staticmethod
    def current_stream(device=None):
        return _STREAM

    default_stream = current_stream

    @staticmethod
    def stream(s=None):
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def set_device(device):
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def memory_allocated(device=None):
        return 0

    max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated

    class nvtx:  # noqa: N801
        range_push = staticmethod(lambda *a, **k: None)
        range_pop = staticmethod(lambda *a, **k: None)
        range = staticmethod(lambda *a, **k: contextlib.nullcontext())

    def __getattr__(self, name):
        return getattr(torch.cuda, name)
