"""``verl.cpu.offload-host-buffers``: verl's Megatron offload allocates its host copies unpinned where
torch has no accelerator.

verl 0.9.1's ``offload_megatron_model_to_cpu`` (verl/utils/megatron_utils.py) copies every DDP
buffer's parameters into a host buffer created with ``torch.empty(..., device="cpu",
pin_memory=True)`` before freeing the buffer's storage (``storage().resize_(0)``);
``load_megatron_model_to_gpu`` restores the storage and copies back. Without an accelerator torch
refuses pinned memory ("pin_memory=True requires a CUDA or other accelerator backend"). In that module
only, ``torch`` is a view of torch whose tensor factories drop ``pin_memory`` when torch has no
accelerator; with one, and every other name, it is torch's own.
"""

from __future__ import annotations

import torch

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements
from mcore_dapo.patching.views import ModuleView, factories

MODULE = "verl.utils.megatron_utils"
_FACTORIES = ("empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like",
              "empty_strided")


def has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return accelerator.is_available()
    return torch.cuda.is_available()


def _unpinned(kwargs: dict) -> None:
    if kwargs.get("pin_memory") and not has_accelerator():
        kwargs["pin_memory"] = False


# ``torch`` whose factories take ``pin_memory=True`` without an accelerator (unpinned)
VIEW = ModuleView(torch, **factories(torch, _FACTORIES, _unpinned))


@implements("verl.cpu.offload-host-buffers")
def _offload_host_buffers(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.replace(VIEW, f"{MODULE}:torch")))
