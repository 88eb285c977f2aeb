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
_CANON_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(linear_fc[12])\.weight$")

_TE_FUSED = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


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
