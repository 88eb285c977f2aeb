"""Megatron's local DotProductAttention on the CPU, reading a ``[batch, seq]`` mask as TE's causal kernels do.

verl's BSHD path hands the model a ``[batch, seq]`` padding mask (right padding). Transformer
Engine's causal attention (CUDA, and MindSpeed's on Ascend) does not use it: padding sits
after every real token, so causal attention already keeps it out. The local kernel would
instead try to broadcast it against ``[batch, heads, seq, seq]`` scores; here a 2-D mask
means "causal" and 4-D masks pass through unchanged.

Used by the CPU adapter's layer spec (:meth:`mcore_dapo.devices.cpu.CpuAdapter.layer_spec`); importing this module
imports Megatron (the CPU runs no MindSpeed).
"""

from __future__ import annotations

from megatron.core.transformer.dot_product_attention import DotProductAttention


class CausalDotProductAttention(DotProductAttention):
    def forward(self, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = None
        return super().forward(query, key, value, attention_mask, *args, **kwargs)
