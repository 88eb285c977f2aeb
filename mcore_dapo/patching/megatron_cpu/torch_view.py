"""``cpu.megatron.torch-cuda-namespace``: inside Megatron's modules only, the module global ``torch``
is a view of torch whose ``cuda`` maps to the CPU and whose tensor factories turn device "cuda"
into "cpu". Modules Megatron imports later (it imports lazily) get the view as they load."""

from __future__ import annotations

import sys

import torch

from mcore_dapo.patching.import_hooks import after_each_import
from mcore_dapo.patching.megatron_cpu.cuda_namespace import CpuCuda
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements
from mcore_dapo.patching.views import ModuleView, factories


def _cpu_device(dev):
    """Map a CUDA device spec (str, torch.device, int index) to the CPU; leave others alone."""
    if dev is None:
        return None
    if isinstance(dev, int):
        return torch.device("cpu")
    if isinstance(dev, str) and dev.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


_FACTORIES = (
    "empty", "zeros", "ones", "full", "arange", "tensor", "as_tensor", "randn", "rand", "randint",
    "randperm", "eye", "linspace", "empty_like", "zeros_like", "ones_like", "full_like", "empty_strided",
)


def _cpu_kwargs(kwargs: dict) -> None:
    if "device" in kwargs:
        kwargs["device"] = _cpu_device(kwargs["device"])


# ``torch`` for Megatron's modules: real torch except ``cuda`` and device="cuda" factories
VIEW = ModuleView(torch, cuda=CpuCuda(), **factories(torch, _FACTORIES, _cpu_kwargs))


@implements("cpu.megatron.torch-cuda-namespace")
def _torch_cuda_namespace(patch: Patcher) -> None:
    def retarget(module):
        if module.__dict__.get("torch") is torch:
            patch.replace(VIEW, f"{module.__name__}:torch")

    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.") and module:
            retarget(module)
    patch.on_undo(after_each_import("megatron.", retarget))
