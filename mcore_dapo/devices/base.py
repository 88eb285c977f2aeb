"""The device adapter interface: everything that differs between CUDA, Ascend and the CPU."""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod

from mcore_dapo.patching import registry


class DeviceAdapter(ABC):
    """One per device kind. Order of use:

    1. :meth:`prepare` before Megatron is imported (MindSpeed must come first on Ascend);
    2. :meth:`apply_patches` once Megatron is importable;
    3. :meth:`configure` with feature flags, before ``initialize_model_parallel``;
    4. :meth:`init_distributed`, then Megatron's parallel state;
    5. :meth:`layer_spec` when the model is built.
    """

    name: str = ""
    backend: str = ""

    @classmethod
    @abstractmethod
    def detect(cls) -> bool:
        """True when this machine has this kind of device."""

    def prepare(self) -> None:
        """Work that must happen before Megatron is imported."""

    def apply_patches(self) -> list[registry.PatchStatus]:
        from mcore_dapo.patching import load_implementations

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

    @abstractmethod
    def device(self, local_rank: int):
        """The torch.device this process computes on."""

    def set_device(self, local_rank: int) -> None:
        pass

    def init_distributed(self, timeout_s: int = 600) -> None:
        """torch.distributed from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...)."""
        import datetime

        import torch.distributed as dist

        if dist.is_initialized():
            return
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.set_device(local_rank)
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

    def describe(self) -> dict:
        return {"device": self.name, "backend": self.backend}


def megatron_imported() -> bool:
    return any(m == "megatron" or m.startswith("megatron.") for m in sys.modules)
