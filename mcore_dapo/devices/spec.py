"""Layer-spec fix-ups shared by the device adapters."""

from __future__ import annotations

from mcore_dapo.bridge.names import te_fused_norms


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
        layer.submodules.sharded_state_dict_keys_map = te_fused_norms(is_moe_layer_spec(layer))
    return block_spec
