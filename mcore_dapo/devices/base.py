"""The device adapter interface: everything that differs between CUDA, Ascend and the CPU."""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod

from mcore_dapo.devices.fast_paths import FastPaths
from mcore_dapo.devices.rollout import RolloutSettings
from mcore_dapo.patching import registry


class DeviceAdapter(ABC):
    """One per device kind, its life cycle and memory; what it runs fast is :attr:`fast`
    (:class:`~mcore_dapo.devices.fast_paths.FastPaths`), the rollout engine's settings :attr:`rollout`
    (:class:`~mcore_dapo.devices.rollout.RolloutSettings`), each subclassed per device in the device's file.
    Order of use:

    1. :meth:`prepare` before Megatron is imported (MindSpeed must come first on Ascend);
    2. :meth:`apply_patches` once Megatron is importable;
    3. :meth:`configure` with feature flags (``fast.configure_flags``), before ``initialize_model_parallel``;
    4. :meth:`init_distributed`, then Megatron's parallel state, then :meth:`mark_model_parallel_initialised`;
    5. :meth:`layer_spec` when the model is built, :meth:`to_device` once it is.

    The other methods answer what callers would otherwise branch on the device's name for.
    """

    name: str = ""
    backend: str = ""
    fast_paths_class: type = FastPaths  # the device's (devices/fast_paths.py's base: none on)
    rollout_class: type = RolloutSettings  # the device's (devices/rollout.py)

    def __init__(self):
        self.fast = self.fast_paths_class(self)  # fast paths and the model features the device runs
        self.rollout = self.rollout_class(self)  # the rollout engine's settings on this device

    @classmethod
    @abstractmethod
    def detect(cls) -> bool:
        """True when this machine has this kind of device."""

    def prepare(self) -> None:
        """Work that must happen before Megatron is imported."""

    def apply_patches(self) -> list[registry.PatchStatus]:
        """The installed torch and megatron-core checked against the supported ranges (one line when
        outside), then every manifest patch for this device that applies to them."""
        from mcore_dapo import versions
        from mcore_dapo.patching import load_implementations

        versions.check_stack()
        load_implementations()
        return registry.apply(self.name)

    def patch_status(self) -> list[registry.PatchStatus]:
        from mcore_dapo.patching import load_implementations

        load_implementations()
        return registry.status(self.name)

    def configure(self, flags: dict | None = None) -> None:
        """Apply feature flags (MindSpeed's on Ascend). Must run before initialize_model_parallel."""
        if flags:
            raise ValueError(f"device {self.name!r} takes no feature flags, got {sorted(flags)}")

    def mark_model_parallel_initialised(self) -> None:
        """Called once Megatron's parallel state exists (feature flags come too late after it)."""

    @abstractmethod
    def device(self, local_rank: int):
        """The torch.device this process computes on."""

    def local_device(self):
        """The torch.device of this process (torchrun's LOCAL_RANK)."""
        return self.device(local_rank())

    def set_device(self, local_rank: int) -> None:
        pass

    def has_device_memory(self) -> bool:
        """Whether the device has memory apart from the host's. Only then do models move to it after
        being built (Megatron initialises them on the device itself), and do offloading to the host
        and loading back mean anything."""
        return True

    def to_device(self, module):
        """A model built by Megatron, on this process's device."""
        return module.to(self.local_device()) if self.has_device_memory() else module

    def _torch_module(self):
        """``torch.cuda`` / ``torch.npu``: None where the device has no memory of its own or is absent."""
        import torch

        return getattr(torch, self.name, None) if self.has_device_memory() else None

    def device_count(self) -> int | None:
        """Devices visible to this process (None: processes share the host, any number of them)."""
        mod = self._torch_module()
        try:
            return int(mod.device_count()) if mod is not None and mod.is_available() else 0
        except RuntimeError:  # a driver that does not answer: no usable device
            return 0

    def synchronize(self) -> None:
        """Wait for the work queued on the device (timings)."""
        mod = self._torch_module()
        if mod is not None:
            mod.synchronize()

    def memory_allocated(self) -> int | None:
        """Bytes the device's allocator holds, after the queued work (None: no such counter)."""
        mod = self._torch_module()
        if mod is None:
            return None
        mod.synchronize()
        return int(mod.memory_allocated())

    def max_memory_allocated(self) -> int | None:
        """Peak bytes the device's allocator held in this process (None: no such counter)."""
        mod = self._torch_module()
        return None if mod is None else int(mod.max_memory_allocated())

    def device_identity(self) -> str | None:
        """The physical identity of this process's current device, where it can be read (None elsewhere):
        the engine and the sending rank must share one device for verl's IPC weight transfer."""
        return None

    def init_distributed(self, timeout_s: int = 600) -> None:
        """torch.distributed from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...)."""
        import datetime

        import torch.distributed as dist

        if dist.is_initialized():
            return
        self.set_device(local_rank())
        dist.init_process_group(backend=self.backend, timeout=datetime.timedelta(seconds=timeout_s))

    @abstractmethod
    def layer_spec(self, config, vp_stage: int | None = None, pp_rank: int | None = None):
        """The GPT decoder block spec Megatron builds on this device."""

    def seed(self, seed: int) -> None:
        import random

        import numpy as np
        import torch
        from megatron.core import tensor_parallel

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)

    def expected_stack(self) -> list["StackRequirement"]:
        """The software stack this device's recipe pins (docs/ASCEND.md on Ascend); empty: no fixed stack."""
        return []

    def describe(self) -> dict:
        return {"device": self.name, "backend": self.backend}


class StackRequirement:
    """One component of a device's recipe: accepted version prefixes, and where it comes from."""

    def __init__(self, name: str, accepted: tuple[str, ...], source: str, install: str, probe=None):
        self.name, self.accepted, self.source, self.install = name, accepted, source, install
        self._probe = probe

    def installed(self) -> str | None:
        """The installed version (the distribution's metadata unless a probe is given), None when absent."""
        if self._probe is not None:
            return self._probe()
        import importlib.metadata as md

        for dist in (self.name, self.name.replace("_", "-"), self.name.replace("-", "_")):
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                continue
        return None

    def ok(self, installed: str | None) -> bool:
        """Whether ``installed`` is one of the accepted versions (``2.7.1`` accepts ``2.7.1.post2``)."""
        if not installed:
            return False
        base = installed.split("+")[0]
        return any(base == a or base.startswith(a + ".") for a in self.accepted)


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def megatron_imported() -> bool:
    return any(m == "megatron" or m.startswith("megatron.") for m in sys.modules)
