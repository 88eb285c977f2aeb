"""A ``cpu`` platform for verl 0.9.1's platform registry.

verl 0.9.1 knows ``nvidia``, ``huawei`` and ``amd``; with none of them present it falls
back to ``nvidia`` and calls ``torch.cuda``. This platform lets verl's trainer, workers and
Megatron engine run on the CPU: device ``cpu``, collectives on gloo, trainer slots
counted as Ray's logical ``GPU`` resource (start Ray with ``num_gpus`` = the slots).
It is registered after verl's own platforms, so verl's auto-detection picks it only when no
accelerator is found and the project's one detection, :func:`mcore_dapo.devices.detect`, says ``cpu``
(torch is a CPU build, or the host has no GPU driver and no torch_npu). Memory queries
answer from the process (``max_memory_allocated`` is the peak RSS); stream and IPC calls are no-ops.

Importing this module imports verl's platform base and registers the class (its row of
:mod:`mcore_dapo.verl_plugin.registrations`' table); the entry point applies the patch registry's verl patches for it
(``verl.cpu.process-group``).
"""

from __future__ import annotations

import contextlib
import types

import torch
from verl.plugin.platform.platform_base import PlatformBase

from mcore_dapo.verl_plugin.registrations import registered

NAME = "cpu"


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _mem_get_info(device=None) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _noop(*args, **kwargs) -> None:
    return None


def cpu_platform_applies() -> bool:
    """The device adapters' answer (:func:`mcore_dapo.devices.detect`): one notion of "on the CPU"."""
    from mcore_dapo.devices import on_cpu as host_on_cpu

    return host_on_cpu()


def device_module() -> types.ModuleType:
    """``torch.cpu`` with the ``torch.cuda``-style calls verl makes (memory, rng, cache) added."""
    mod = types.ModuleType("mcore_dapo_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    mod.is_available = lambda: True
    mod.current_device = lambda: NAME
    mod.device_count = lambda: 1
    mod.set_device = _noop
    mod.synchronize = _noop
    mod.empty_cache = _noop
    mod.ipc_collect = _noop
    mod.set_per_process_memory_fraction = _noop
    mod.reset_peak_memory_stats = _noop
    mod.memory_allocated = lambda device=None: _rss()
    mod.memory_reserved = lambda device=None: _rss()
    mod.max_memory_allocated = lambda device=None: _peak_rss()
    mod.max_memory_reserved = lambda device=None: _peak_rss()
    mod.mem_get_info = _mem_get_info
    mod.get_device_name = lambda device=None: "cpu"
    mod.manual_seed = torch.manual_seed
    mod.manual_seed_all = torch.manual_seed
    mod.get_rng_state = lambda device=None: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    return mod


@registered
class PlatformCPU(PlatformBase):
    """verl on the CPU: gloo collectives, trainer slots as Ray's logical GPU resource."""

    _module = None

    @property
    def device_name(self) -> str:
        return NAME

    @property
    def vendor_name(self) -> str:
        return NAME

    @property
    def device_module(self):
        if PlatformCPU._module is None:
            PlatformCPU._module = device_module()
        return PlatformCPU._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Probed after verl's own platforms. A CUDA or Ascend build of torch without a visible
        # device on a host that has one (a CPU-only Ray actor on a GPU node) keeps verl's
        # fallback to ``nvidia`` (devices.detect() is cuda there); on a host with no accelerator
        # at all this platform answers.
        return cpu_platform_applies()

    def current_device(self):
        return NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for actors holding its logical GPU slots

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    # Trainer slots are Ray's logical "GPU" resource (ray.init(num_gpus=N) needs no GPU): verl's
    # resource pools, placement groups and its resource check count "GPU" (or "NPU") only.
    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None
