"""``cpu.torch.pin-memory``: ``Tensor.pin_memory()`` on a host without an accelerator.

Pinned (page-locked) host memory exists for copies to an accelerator; on a torch without one (the CPU build)
``pin_memory()`` raises ``RuntimeError: Cannot access accelerator device when none is available``. verl 0.9.1's
Decoupled PPO in its separate modes keeps the old policy's weights on the host with
``.cpu().clone().pin_memory()`` (``copy_megatron_model_to_cpu``, verl/utils/megatron_utils.py, called by
``DetachActorWorker.save_model_to_cpu``, verl/experimental/separation/engine_workers.py), so
``algorithm.rollout_correction.bypass_mode=False`` stops there on the CPU. Where no accelerator is available,
``pin_memory()`` returns a copy of the tensor in ordinary host memory (what pinning gives, less the page lock,
which only matters for transfers to a device); with an accelerator torch's own runs.
"""

from __future__ import annotations

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

TARGET = "torch:Tensor.pin_memory"


def _host_copy_without_accelerator(original):
    def pin_memory(self, *args, **kwargs):
        import torch

        if self.device.type == "cpu" and not torch.accelerator.is_available():
            return self.clone()
        return original(self, *args, **kwargs)

    return pin_memory


@implements("cpu.torch.pin-memory")
def _pin_memory(patch: Patcher) -> None:
    patch.wrap(_host_copy_without_accelerator, TARGET)
