"""Local Megatron parameter names <-> canonical names.

A rank's ``named_parameters()`` differ from the canonical table names in three
ways, all resolved here and nowhere else:

* layers are numbered locally per pipeline stage / virtual chunk
  (``decoder.layers.0`` on stage 1 is global layer ``num_layers/pp``);
* experts are numbered locally per EP rank, and named by container:
  SequentialMLP ``mlp.experts.local_experts.{i}.linear_fc1.weight``,
  TEGroupedMLP (and MindSpeed's NPU grouped linear) ``mlp.experts.linear_fc1.weight{i}``;
  global expert = ``ep_rank * num_local_experts + i``;
* the Transformer Engine spec fuses norms into the next linear
  (``self_attention.linear_qkv.layer_norm_weight``, and for dense MLPs
  ``mlp.linear_fc1.layer_norm_weight``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_SEQ_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12]\.weight)$")
_TE_EXPERT = re.compile(r"^mlp\.experts\.(linear_fc[12])\.weight(\d+)$")

# The norms the Transformer Engine spec fuses into the next linear, as a layer's
# ``sharded_state_dict_keys_map`` writes them: own module prefix -> prefix inside the linear.
# The pre-MLP norm is fused only in dense layers: an MoE layer has no ``linear_fc1``.
_TE_FUSED_ATTENTION = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_"}
_TE_FUSED_DENSE_MLP = {"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def te_fused_norms(moe_layer: bool) -> dict[str, str]:
    """The TE spec's keys map of a layer (module prefix -> fused prefix)."""
    return dict(_TE_FUSED_ATTENTION) if moe_layer else {**_TE_FUSED_ATTENTION, **_TE_FUSED_DENSE_MLP}


# fused parameter (TE name) -> canonical norm
_TE_FUSED = {fused + "weight": norm + "weight" for norm, fused in te_fused_norms(moe_layer=False).items()}


@dataclass(frozen=True)
class ExpertPlacement:
    ep_rank: int
    num_local_experts: int

    def to_global(self, i: int) -> int:
        return self.ep_rank * self.num_local_experts + i

    def to_local(self, e: int) -> int | None:
        lo = self.ep_rank * self.num_local_experts
        return e - lo if lo <= e < lo + self.num_local_experts else None


def canonical_name(local: str, layer_map: dict[int, int], experts: ExpertPlacement | None) -> str:
    """Canonical name of a local parameter. ``layer_map``: local layer index -> global."""
    m = _LAYER.match(local)
    if not m:
        return local
    layer = layer_map[int(m.group(1))]
    rest = m.group(2)
    rest = _TE_FUSED.get(rest, rest)
    if experts is not None:
        if em := _SEQ_EXPERT.match(rest):
            rest = f"mlp.experts.{experts.to_global(int(em.group(1)))}.{em.group(2)}"
        elif em := _TE_EXPERT.match(rest):
            rest = f"mlp.experts.{experts.to_global(int(em.group(2)))}.{em.group(1)}.weight"
    return f"decoder.layers.{layer}.{rest}"


def layer_map_of(chunk) -> dict[int, int]:
    """local index -> global (0-based) layer, read from the built model's layers."""
    decoder = getattr(chunk, "decoder", None)
    if decoder is None:
        return {}
    return {i: layer.layer_number - 1 for i, layer in enumerate(decoder.layers)}
