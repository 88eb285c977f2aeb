"""Device adapters (CUDA, Ascend NPU, CPU), chosen automatically or by name / MCORE_DAPO_DEVICE."""

from __future__ import annotations

import os

from mcore_dapo.devices.base import DeviceAdapter
from mcore_dapo.errors import UserError

DEVICES = ("cuda", "npu", "cpu")


def _classes():
    from mcore_dapo.devices.cpu import CpuAdapter
    from mcore_dapo.devices.cuda import CudaAdapter
    from mcore_dapo.devices.npu import NpuAdapter

    return {"npu": NpuAdapter, "cuda": CudaAdapter, "cpu": CpuAdapter}


_ACTIVE: dict[str, DeviceAdapter] = {}

# what a host with an NVIDIA GPU has, whatever CUDA_VISIBLE_DEVICES hides from this process
NVIDIA_DRIVER = "/proc/driver/nvidia"


def detect() -> str:
    """The host's device, the one answer to "is this the CPU" (the adapters' default, verl's ``cpu``
    platform, the CPU patches, the tests' markers): npu when torch_npu is installed; cuda when CUDA is
    usable here, or when torch is a CUDA build on a host with an NVIDIA driver (a process whose
    CUDA_VISIBLE_DEVICES hides every device, such as a CPU-only Ray actor on a GPU node, is on a CUDA
    host, where verl's platform stays ``nvidia``); else cpu (a CUDA build of torch on a host without a
    GPU, the Ascend stack's torch 2.7.1 here, computes on the CPU)."""
    classes = _classes()
    for name in ("npu", "cuda"):
        if classes[name].detect():
            return name
    import torch

    if torch.version.cuda is not None and os.path.exists(NVIDIA_DRIVER):
        return "cuda"
    return "cpu"


def on_cpu() -> bool:
    """Whether this host computes on the CPU: :func:`detect` is ``cpu``."""
    return detect() == "cpu"


def get_adapter(name: str | None = None) -> DeviceAdapter:
    """The adapter for ``name`` (or $MCORE_DAPO_DEVICE, or the detected device); one per process."""
    name = name or os.environ.get("MCORE_DAPO_DEVICE") or detect()
    if name not in DEVICES:
        raise UserError(f"device={name!r} is not accepted: accepted are {', '.join(DEVICES)}")
    if name not in _ACTIVE:
        _ACTIVE[name] = _classes()[name]()
    return _ACTIVE[name]


__all__ = ["DEVICES", "DeviceAdapter", "detect", "get_adapter", "on_cpu"]
