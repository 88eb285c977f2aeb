"""Layer-spec fix-ups shared by the device adapters."""

from __future__ import annotations

# What the Transformer Engine spec writes in torch_dist checkpoints: the input norm
# is fused into linear_qkv; for MoE layers the pre-MLP norm stays its own module,
# for dense layers it is fused into linear_fc1.
TE_KEYS_MAP_MOE = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_"}
TE_KEYS_MAP_DENSE = {
    "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
}


def is_moe_layer_spec(layer_spec) -> bool:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    return layer_spec.submodules.mlp.module is MoELayer


def te_compatible_keys(block_spec):
    """Give local-spec layers the checkpoint keys a TE-spec model of the same shape has.

    Megatron's local spec renames ``pre_mlp_layernorm.`` to ``mlp.linear_fc1.layer_norm_``
    even in MoE layers, where the TE spec (what verl builds on CUDA and MindSpeed
    keeps on Ascend) loads ``pre_mlp_layernorm.weight``.
    """
    for layer in block_spec.layer_specs:
        keys = TE_KEYS_MAP_MOE if is_moe_layer_spec(layer) else TE_KEYS_MAP_DENSE
        layer.submodules.sharded_state_dict_keys_map = dict(keys)
    return block_spec
