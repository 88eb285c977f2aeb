"""The model bridge: one object answering "which HF tensors make this Megatron parameter, and how"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from mcore_dapo.bridge.hf_config import HFModelConfig, load_hf_config
from mcore_dapo.bridge.layout import Layout
from mcore_dapo.bridge.mapping import Dims, Mapping, pattern_rx
from mcore_dapo.bridge.megatron_config import padded_vocab_size
from mcore_dapo.bridge.models import get_model

# the parts of the table a layer has, by whether it is an MoE layer
_LAYER_PARTS = {False: ("common", "dense_mlp"), True: ("common", "moe")}


def layer_mappings(table: list[Mapping], cfg: HFModelConfig, layer: int) -> list[Mapping]:
    """The table's mappings that layer ``layer`` has (its MLP's part: dense or MoE), table order."""
    parts = _LAYER_PARTS[cfg.is_moe_layer(layer)]
    return [m for m in table if m.per_layer and m.part in parts]


@dataclass(frozen=True)
class Resolved:
    mapping: Mapping
    megatron: str  # canonical Megatron name
    hf: tuple[str, ...]  # concrete HF names
    layer: int | None
    expert: int | None


class Bridge:
    """HF <-> Megatron mapping for one model config and tensor-parallel size (the model's table: its spec,
    :func:`mcore_dapo.bridge.models.get_model`)."""

    def __init__(self, cfg: HFModelConfig, layout: Layout = Layout(), make_vocab_size_divisible_by: int | None = None):
        self.cfg = cfg
        self.layout = layout.validate(cfg)
        self.dims = Dims(
            num_attention_heads=cfg.num_attention_heads,
            num_query_groups=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            vocab_size=cfg.vocab_size,
            padded_vocab_size=padded_vocab_size(cfg.vocab_size, layout.tp, make_vocab_size_divisible_by),
        )
        self.spec = get_model(cfg)
        self.table, self.copies = self.spec.table(cfg.tie_word_embeddings)
        self._megatron_rx = [(pattern_rx(m.megatron), m) for m in self.table]
        self._hf_rx = [(pattern_rx(p), m, i) for m in self.table for i, p in enumerate(m.hf)]

    @classmethod
    def from_hf(cls, path, layout: Layout = Layout(), **kw) -> "Bridge":
        return cls(load_hf_config(path), layout, **kw)

    def resolve(self, megatron_name: str) -> Resolved:
        """Mapping and HF names for a canonical Megatron name (a copy: its original's); KeyError if unmapped."""
        megatron_name = self.copies.get(megatron_name, megatron_name)
        for rx, m in self._megatron_rx:
            if mt := rx.match(megatron_name):
                g = mt.groupdict()
                hf = tuple(p.format(**g) for p in m.hf)
                return Resolved(
                    m, megatron_name, hf,
                    int(g["L"]) if "L" in g else None,
                    int(g["E"]) if "E" in g else None,
                )
        raise KeyError(f"no HF mapping for Megatron parameter {megatron_name!r}")

    def resolve_hf(self, hf_name: str) -> Resolved:
        """The mapping an HF tensor belongs to (and all its sibling HF names)."""
        for rx, m, _ in self._hf_rx:
            if mt := rx.match(hf_name):
                g = mt.groupdict()
                return self.resolve(m.megatron.format(**g))
        raise KeyError(f"no Megatron mapping for HF tensor {hf_name!r}")

    def _layer_mappings(self, layer: int) -> list[Mapping]:
        return layer_mappings(self.table, self.cfg, layer)

    def _layer_resolved(self, layer: int) -> list[Resolved]:
        """A layer's tensors, table order, an expert mapping's experts one after the other."""
        return [self.resolve(m.megatron.format(L=layer, E=e)) for m in self._layer_mappings(layer)
                for e in (range(self.cfg.num_experts) if m.per_expert else (None,))]

    @cached_property
    def _blocks(self) -> list[list[Resolved]]:
        """The embedding, each layer, then the final norm (and output layer): every canonical tensor."""
        outside = [self.resolve(m.megatron) for m in self.table if not m.per_layer]
        return [outside[:1], *(self._layer_resolved(layer) for layer in range(self.cfg.num_layers)), outside[1:]]

    @cached_property
    def all_resolved(self) -> list[Resolved]:
        """Every canonical Megatron tensor of the model, block by block (a layer's experts mapping by mapping)."""
        return [r for block in self._blocks for r in block]

    def hf_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every HF tensor with the shape the config implies, in checkpoint order (each expert's tensors together)."""
        sizes, out = self.spec.hf_sizes(self.cfg), {}
        for block in self._blocks:
            for r in sorted(block, key=lambda r: -1 if r.expert is None else r.expert):
                out.update(zip(r.hf, r.mapping.hf_shapes(sizes)))
        return out

    def hf_names(self) -> list[str]:
        """Every HF tensor name the model has (what vLLM's load_weights consumes)."""
        return [n for r in self.all_resolved for n in r.hf]

    def describe(self) -> str:
        """The mapping table, one line per kind, for review."""
        rows = []
        for m in self.table:
            split = {None: "replicated", 0: "split rows", 1: "split cols"}[m.split_dim]
            rows.append(f"{m.megatron:55s} <- {', '.join(m.hf)}  [{type(m).__name__}, {m.group or '-'}, {split}]")
        return "\n".join(rows)
