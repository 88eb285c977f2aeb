"""``cpu.megatron.float16-optimizer-param-types``: during the bf16/fp16 optimizer's ``__init__`` only,
CPU parameters answer ``type()`` with the ``torch.cuda.*`` name of their dtype."""

from __future__ import annotations

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


def _cuda_type_name(param) -> str:
    name = torch.Tensor.type(param)
    return name.replace("torch.", "torch.cuda.", 1) if param.device.type == "cpu" else name


def cuda_typed_params(original):
    """An optimizer class's ``__init__`` during which the wrapped optimizer's CPU parameters answer
    ``type()`` with the ``torch.cuda.*`` name of their dtype (also :mod:`.distrib_optimizer`)."""

    def __init__(self, optimizer, *args, **kwargs):
        groups = optimizer.param_groups if optimizer is not None else []
        params = [p for g in groups for p in g["params"]]
        for p in params:  # seen as torch.cuda.* by the type check in __init__ only
            p.type = _cuda_type_name.__get__(p)
        try:
            original(self, optimizer, *args, **kwargs)
        finally:
            for p in params:
                del p.type

    return __init__


@implements("cpu.megatron.float16-optimizer-param-types")
def _float16_optimizer_param_types(patch: Patcher) -> None:
    patch.wrap(cuda_typed_params, "megatron.core.optimizer.optimizer:Float16OptimizerWithFloat16Params.__init__")
