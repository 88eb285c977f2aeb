"""Device adapters (CUDA, Ascend NPU, CPU), chosen automatically or by name / MCORE_DAPO_DEVICE."""

from __future__ import annotations

import os

from mcore_dapo.devices.base import DeviceAdapter
from mcore_dapo.errors import UserError
from mcore_dapo.host import detect, on_cpu  # the host's device: a leaf module the patches ask too

DEVICES = ("cuda", "npu", "cpu")


def _classes():
    from mcore_dapo.devices.cpu import CpuAdapter
    from mcore_dapo.devices.cuda import CudaAdapter
    from mcore_dapo.devices.npu import NpuAdapter

    return {"npu": NpuAdapter, "cuda": CudaAdapter, "cpu": CpuAdapter}


_ACTIVE: dict[str, DeviceAdapter] = {}


def get_adapter(name: str | None = None) -> DeviceAdapter:
    """The adapter for ``name`` (or $MCORE_DAPO_DEVICE, or the detected device); one per process."""
    name = name or os.environ.get("MCORE_DAPO_DEVICE") or detect()
    if name not in DEVICES:
        raise UserError(f"device={name!r} is not accepted: accepted are {', '.join(DEVICES)}")
    if name not in _ACTIVE:
        _ACTIVE[name] = _classes()[name]()
    return _ACTIVE[name]


__all__ = ["DEVICES", "DeviceAdapter", "detect", "get_adapter", "on_cpu"]
