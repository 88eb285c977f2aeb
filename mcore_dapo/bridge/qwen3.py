"""The Qwen3 / Qwen3-MoE tensor table: the one source of truth for HF <-> Megatron names.

Megatron names are canonical (see :mod:`mcore_dapo.bridge.names`): global layer
``{L}``, global expert ``{E}``, separate norms whatever the layer spec fuses.
"""

from __future__ import annotations

from mcore_dapo.bridge.mapping import gated_mlp, qkv, replicated, row, vocab

L = "decoder.layers.{L}."
H = "model.layers.{L}."

COMMON = [
    vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
    replicated(L + "input_layernorm.weight", H + "input_layernorm.weight"),
    qkv(
        L + "self_attention.linear_qkv.weight",
        H + "self_attn.q_proj.weight",
        H + "self_attn.k_proj.weight",
        H + "self_attn.v_proj.weight",
    ),
    replicated(L + "self_attention.q_layernorm.weight", H + "self_attn.q_norm.weight"),
    replicated(L + "self_attention.k_layernorm.weight", H + "self_attn.k_norm.weight"),
    row(L + "self_attention.linear_proj.weight", H + "self_attn.o_proj.weight"),
    replicated(L + "pre_mlp_layernorm.weight", H + "post_attention_layernorm.weight"),
    replicated("decoder.final_layernorm.weight", "model.norm.weight"),
]

OUTPUT = vocab("output_layer.weight", "lm_head.weight")

DENSE_MLP = [
    gated_mlp(L + "mlp.linear_fc1.weight", H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"),
    row(L + "mlp.linear_fc2.weight", H + "mlp.down_proj.weight"),
]

MOE_MLP = [
    replicated(L + "mlp.router.weight", H + "mlp.gate.weight"),
    gated_mlp(
        L + "mlp.experts.{E}.linear_fc1.weight",
        H + "mlp.experts.{E}.gate_proj.weight",
        H + "mlp.experts.{E}.up_proj.weight",
        group="etp",
    ),
    row(L + "mlp.experts.{E}.linear_fc2.weight", H + "mlp.experts.{E}.down_proj.weight", group="etp"),
]


def qwen3_table(tie_word_embeddings: bool) -> list:
    table = COMMON + DENSE_MLP + MOE_MLP
    if not tie_word_embeddings:
        table = table + [OUTPUT]
    return table


def hf_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of a Qwen3(-MoE) checkpoint with the shape its config implies, in checkpoint order."""
    h, d = cfg.hidden_size, cfg.head_dim
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * d, h)
        out[p + "self_attn.q_norm.weight"] = (d,)
        out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "self_attn.o_proj.weight"] = (h, cfg.num_attention_heads * d)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if cfg.is_moe_layer(layer):
            out[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            f = cfg.moe_intermediate_size
            for e in range(cfg.num_experts):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = (f, h)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = (f, h)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = (h, f)
        else:
            f = cfg.intermediate_size
            out[p + "mlp.gate_proj.weight"] = (f, h)
            out[p + "mlp.up_proj.weight"] = (f, h)
            out[p + "mlp.down_proj.weight"] = (h, f)
    out["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    return out
