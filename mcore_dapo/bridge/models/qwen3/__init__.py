"""Qwen3 and Qwen3-MoE: the table (table.py), the config.json reader (hf_config.py), the Megatron settings
(megatron.py) and vLLM's layout (vllm.py), registered as ``Qwen3MoeForCausalLM`` and ``Qwen3ForCausalLM``."""

from __future__ import annotations

from mcore_dapo.bridge.models import register
from mcore_dapo.bridge.models.qwen3 import megatron, vllm
from mcore_dapo.bridge.models.qwen3.hf_config import MODEL_TYPES, parse_qwen3_config
from mcore_dapo.bridge.models.qwen3.table import hf_sizes, hub_slices, qwen3_table
from mcore_dapo.bridge.models.spec import ModelSpec, VllmLayout

SPEC = register(ModelSpec(
    name="qwen3",
    architectures=("Qwen3MoeForCausalLM", "Qwen3ForCausalLM"),
    model_types=MODEL_TYPES,
    parse_config=parse_qwen3_config,
    table=qwen3_table,
    hf_sizes=hf_sizes,
    hub_slices=hub_slices,
    transformer_config=megatron.transformer_config,
    gpt_model=megatron.gpt_model,
    activation=megatron.ACTIVATION,
    vllm=VllmLayout(vllm.fuse, vllm.PADDED_VOCAB, vllm.STACKED, vllm.expert_prefix),
    hf_router="mlp.gate",
))
