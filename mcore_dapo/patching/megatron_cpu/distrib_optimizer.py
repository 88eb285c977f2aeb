"""``cpu.megatron.distrib-optimizer-param-types``: during the distributed optimizer's ``__init__`` only,
CPU parameters answer ``type()`` with the ``torch.cuda.*`` name of their dtype (as for the bf16/fp16
optimizer, :mod:`.float16_optimizer`)."""

from __future__ import annotations

from mcore_dapo.patching.megatron_cpu.float16_optimizer import cuda_typed_params
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


@implements("cpu.megatron.distrib-optimizer-param-types")
def _distrib_optimizer_param_types(patch: Patcher) -> None:
    patch.wrap(cuda_typed_params, "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.__init__")
