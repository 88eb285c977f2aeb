"""A Qwen3 / Qwen3-MoE ``config.json`` -> :class:`~mcore_dapo.bridge.hf_config.HFModelConfig`.

transformers writes some fields under two spellings depending on its version:
``num_experts`` (4.x) and ``num_local_experts`` (5.x), ``rope_theta`` (4.x) and
``rope_parameters.rope_theta`` (5.x), ``torch_dtype`` and ``dtype``. What the mapping does not cover
(sliding windows, shared experts, rope scaling, another activation, attention bias) is refused in one line.
"""

from __future__ import annotations

from mcore_dapo.bridge.hf_config import HFModelConfig, first
from mcore_dapo.errors import UserError

MODEL_TYPES = ("qwen3_moe", "qwen3")


def parse_qwen3_config(raw: dict) -> HFModelConfig:
    model_type = raw.get("model_type")
    if raw.get("use_sliding_window") and raw.get("sliding_window"):
        raise UserError(
            f"use_sliding_window=True (sliding_window={raw.get('sliding_window')}) is not supported: "
            "only full attention is mapped to Megatron"
        )
    if raw.get("shared_expert_intermediate_size"):
        raise UserError(
            "shared_expert_intermediate_size="
            f"{raw['shared_expert_intermediate_size']} is not supported: Qwen3-MoE has no shared expert"
        )
    if raw.get("rope_scaling") or (raw.get("rope_parameters") or {}).get("rope_type", "default") != "default":
        rp = raw.get("rope_scaling") or raw.get("rope_parameters")
        raise UserError(f"rope scaling {rp!r} is not supported: accepted is plain RoPE (rope_type 'default')")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UserError(f"hidden_act={act!r} is not supported: accepted is 'silu' (SwiGLU)")
    rope = raw.get("rope_parameters") or {}
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        num_experts = int(first(raw, "num_experts", "num_local_experts", default=0)) if model_type == "qwen3_moe" else 0
        cfg = HFModelConfig(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(first(raw, "num_key_value_heads", default=heads)),
            head_dim=int(first(raw, "head_dim", default=hidden // heads)),
            intermediate_size=int(raw["intermediate_size"]),
            rms_norm_eps=float(first(raw, "rms_norm_eps", default=1e-6)),
            rope_theta=float(first(rope, "rope_theta", default=first(raw, "rope_theta", default=10000.0))),
            max_position_embeddings=int(first(raw, "max_position_embeddings", default=4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            dtype=str(first(raw, "dtype", "torch_dtype", default="bfloat16")),
            num_experts=num_experts,
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 0)) if num_experts else 0,
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)) if num_experts else 0,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
            router_aux_loss_coef=float(raw.get("router_aux_loss_coef", 0.0) or 0.0),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1) or 1),
            mlp_only_layers=tuple(int(x) for x in (raw.get("mlp_only_layers") or [])),
            raw=dict(raw),
        )
    except KeyError as e:
        raise UserError(f"config.json lacks the field {e.args[0]!r} that a {model_type} config must have") from None
    if cfg.attention_bias:
        raise UserError("attention_bias=True is not supported: Qwen3 attention has no bias")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise UserError(
            f"num_key_value_heads={cfg.num_key_value_heads} does not divide "
            f"num_attention_heads={cfg.num_attention_heads}"
        )
    return cfg
