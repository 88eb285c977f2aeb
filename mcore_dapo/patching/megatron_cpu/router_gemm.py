"""``megatron.router-gemm-without-te``: without Transformer Engine, ``te_general_gemm`` is defined as None
(Megatron's own matmul path in the router's gating linear)."""

from __future__ import annotations

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


@implements("megatron.router-gemm-without-te")
def _router_gemm(patch: Patcher) -> None:
    from megatron.core.transformer.moe import moe_utils

    if "te_general_gemm" not in moe_utils.__dict__:
        patch.replace(None, "megatron.core.transformer.moe.moe_utils:te_general_gemm")
