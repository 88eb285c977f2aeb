"""The Qwen3 / Qwen3-MoE tensor table: the one source of truth for HF <-> Megatron names.

Megatron names are canonical (see :mod:`mcore_dapo.bridge.names`): global layer
``{L}``, global expert ``{E}``, separate norms whatever the layer spec fuses.
HF shapes are written in the size symbols of :func:`hf_sizes`.
"""

from __future__ import annotations

from mcore_dapo.bridge.mapping import FusedExperts, Mapping, gated_mlp, qkv, replicated, row, vocab

L = "decoder.layers.{L}."
H = "model.layers.{L}."

EMBEDDING = vocab("embedding.word_embeddings.weight", "model.embed_tokens.weight")

COMMON = [
    EMBEDDING,
    replicated(L + "input_layernorm.weight", H + "input_layernorm.weight", ("hidden",)),
    qkv(
        L + "self_attention.linear_qkv.weight",
        H + "self_attn.q_proj.weight",
        H + "self_attn.k_proj.weight",
        H + "self_attn.v_proj.weight",
    ),
    replicated(L + "self_attention.q_layernorm.weight", H + "self_attn.q_norm.weight", ("head_dim",)),
    replicated(L + "self_attention.k_layernorm.weight", H + "self_attn.k_norm.weight", ("head_dim",)),
    row(L + "self_attention.linear_proj.weight", H + "self_attn.o_proj.weight", ("hidden", "q_dim")),
    replicated(L + "pre_mlp_layernorm.weight", H + "post_attention_layernorm.weight", ("hidden",)),
    replicated("decoder.final_layernorm.weight", "model.norm.weight", ("hidden",)),
]

OUTPUT = vocab("output_layer.weight", "lm_head.weight")

DENSE_MLP = [
    gated_mlp(L + "mlp.linear_fc1.weight", H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight", "ffn",
              part="dense_mlp"),
    row(L + "mlp.linear_fc2.weight", H + "mlp.down_proj.weight", ("hidden", "ffn"), part="dense_mlp"),
]

EXPERT_FC1 = gated_mlp(
    L + "mlp.experts.{E}.linear_fc1.weight",
    H + "mlp.experts.{E}.gate_proj.weight",
    H + "mlp.experts.{E}.up_proj.weight",
    "moe_ffn", group="etp", part="moe",
)
EXPERT_FC2 = row(L + "mlp.experts.{E}.linear_fc2.weight", H + "mlp.experts.{E}.down_proj.weight",
                 ("hidden", "moe_ffn"), group="etp", part="moe")

MOE_MLP = [
    replicated(L + "mlp.router.weight", H + "mlp.gate.weight", ("experts", "hidden"), part="moe"),
    EXPERT_FC1,
    EXPERT_FC2,
]

# transformers 5 holds a layer's experts fused in memory, gate_up_proj [E, 2I, H] (an expert's gate
# rows first, then its up rows) and down_proj [E, H, I], while checkpoints and weight syncs use the
# hub's per-expert names
FUSED_EXPERTS = (
    FusedExperts(H + "mlp.experts.gate_up_proj", EXPERT_FC1.hf),
    FusedExperts(H + "mlp.experts.down_proj", EXPERT_FC2.hf),
)


def qwen3_table(tie_word_embeddings: bool) -> tuple[list[Mapping], dict[str, str]]:
    """The mappings, and the Megatron names that are copies of another mapped tensor: with tied
    embeddings the output layer (the last pipeline stage's copy of the embedding)."""
    table = COMMON + DENSE_MLP + MOE_MLP
    if tie_word_embeddings:
        return table, {OUTPUT.megatron: EMBEDDING.megatron}
    return table + [OUTPUT], {}


def hf_sizes(cfg) -> dict[str, int]:
    """The values of the size symbols the table's HF shapes are written in."""
    return {
        "vocab": cfg.vocab_size,
        "hidden": cfg.hidden_size,
        "head_dim": cfg.head_dim,
        "q_dim": cfg.num_attention_heads * cfg.head_dim,
        "kv_dim": cfg.num_key_value_heads * cfg.head_dim,
        "ffn": cfg.intermediate_size,
        "moe_ffn": cfg.moe_intermediate_size,
        "experts": cfg.num_experts,
    }


def hub_slices(name: str, shape: tuple[int, ...]) -> dict[str, tuple]:
    """The hub tensors an HF model's in-memory tensor ``name`` of ``shape`` holds: hub name -> index
    into it (``t[index]`` is that hub tensor, a view); a tensor that is not fused is its own hub tensor."""
    for fused in FUSED_EXPERTS:
        if (out := fused.hub_slices(name, shape)) is not None:
            return out
    return {name: ()}
