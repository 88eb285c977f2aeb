"""Qwen3 / Qwen3-MoE's own Megatron-core settings: what :mod:`mcore_dapo.bridge.megatron_config` adds to the
generic TransformerConfig fields and GPTModel arguments for this model."""

from __future__ import annotations

from mcore_dapo.bridge.hf_config import HFModelConfig

ACTIVATION = "silu"  # SwiGLU: torch.nn.functional.silu on the gate, times up


def transformer_config(cfg: HFModelConfig) -> dict:
    """RMSNorm, q/k layernorm, a gated MLP, no biases; the MoE router's softmax (HF's Qwen3MoeSparseMoeBlock)."""
    kw = dict(
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        gated_linear_unit=True,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
    )
    if cfg.is_moe:
        kw.update(
            # norm_topk_prob: softmax over the top-k logits == renormalised top-k of the softmax
            moe_router_pre_softmax=not cfg.norm_topk_prob,
            moe_router_score_function="softmax",
            moe_router_dtype="fp32",
        )
    return kw


def gpt_model(cfg: HFModelConfig) -> dict:
    """Plain RoPE over the whole head (rope scaling is refused when the config is read)."""
    return dict(
        position_embedding_type="rope",
        rotary_base=int(cfg.rope_theta),
        rotary_percent=1.0,
    )
