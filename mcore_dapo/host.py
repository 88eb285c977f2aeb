"""What this host computes on: the one answer to "is this the CPU", for the device adapters, verl's ``cpu``
platform, the CPU patches and the tests' markers. A leaf: imports nothing of the project (the patches under
``patching/`` ask it without importing the device adapters above them)."""

from __future__ import annotations

import importlib.util
import os

# what a host with an NVIDIA GPU has, whatever CUDA_VISIBLE_DEVICES hides from this process
NVIDIA_DRIVER = "/proc/driver/nvidia"


def has_torch_npu() -> bool:
    """torch_npu is installed: an Ascend host (the NPU adapter's detect)."""
    return importlib.util.find_spec("torch_npu") is not None


def cuda_usable() -> bool:
    """A CUDA build of torch sees a GPU here (the CUDA adapter's detect)."""
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def detect() -> str:
    """npu when torch_npu is installed; cuda when CUDA is usable here, or when torch is a CUDA build on a host
    with an NVIDIA driver (a process whose CUDA_VISIBLE_DEVICES hides every device, such as a CPU-only Ray actor
    on a GPU node, is on a CUDA host, where verl's platform stays ``nvidia``); else cpu (a CUDA build of torch on
    a host without a GPU, the Ascend stack's torch 2.7.1 here, computes on the CPU)."""
    if has_torch_npu():
        return "npu"
    import torch

    if cuda_usable() or (torch.version.cuda is not None and os.path.exists(NVIDIA_DRIVER)):
        return "cuda"
    return "cpu"


def on_cpu() -> bool:
    """Whether this host computes on the CPU: :func:`detect` is ``cpu``."""
    return detect() == "cpu"
