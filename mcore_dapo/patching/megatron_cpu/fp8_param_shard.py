"""``cpu.megatron.quantize-param-shard-without-te``: megatron-core 0.12.x's no-Transformer-Engine
``_quantize_param_shard_impl`` returns when it is handed no fp8 parameters, as from core_v0.13.0 on."""

from __future__ import annotations

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


def _nothing_to_quantize(original):
    def _quantize_param_shard_impl(model_params, *args, **kwargs):
        if len(model_params) == 0:  # no fp8 parameters: nothing to cast (what every TE implementation does)
            return None
        return original(model_params, *args, **kwargs)

    return _quantize_param_shard_impl


@implements("cpu.megatron.quantize-param-shard-without-te")
def _quantize_param_shard_without_te(patch: Patcher) -> None:
    patch.wrap(_nothing_to_quantize, "megatron.core.fp8_utils:_quantize_param_shard_impl")
