"""The model bridge: one object answering "which HF tensors make this Megatron parameter, and how"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from mcore_dapo.bridge.hf_config import HFModelConfig, load_hf_config
from mcore_dapo.bridge.layout import Layout
from mcore_dapo.bridge.mapping import Dims, Mapping
from mcore_dapo.bridge.megatron_config import padded_vocab_size
from mcore_dapo.bridge.qwen3 import qwen3_table


@dataclass(frozen=True)
class Resolved:
    mapping: Mapping
    megatron: str  # canonical Megatron name
    hf: tuple[str, ...]  # concrete HF names
    layer: int | None
    expert: int | None


def _compile(pattern: str) -> re.Pattern:
    rx = re.escape(pattern).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)")
    return re.compile("^" + rx + "$")


class Bridge:
    """HF <-> Megatron mapping for one model config and tensor-parallel size."""

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
        self.table = qwen3_table(cfg.tie_word_embeddings)
        self._megatron_rx = [(_compile(m.megatron), m) for m in self.table]
        self._hf_rx = [(_compile(p), m, i) for m in self.table for i, p in enumerate(m.hf)]

    @classmethod
    def from_hf(cls, path, layout: Layout = Layout(), **kw) -> "Bridge":
        return cls(load_hf_config(path), layout, **kw)

    def resolve(self, megatron_name: str) -> Resolved:
        """Mapping and HF names for a canonical Megatron name; KeyError if unmapped."""
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
        moe = self.cfg.is_moe_layer(layer)
        out = []
        for m in self.table:
            if "{L}" not in m.megatron:
                continue
            is_expert_or_router = ".mlp.experts." in m.megatron or ".mlp.router." in m.megatron
            is_dense_mlp = ".mlp.linear_fc" in m.megatron
            if (is_expert_or_router and not moe) or (is_dense_mlp and moe):
                continue
            out.append(m)
        return out

    @cached_property
    def all_resolved(self) -> list[Resolved]:
        """Every canonical Megatron tensor of the model, in HF checkpoint order."""
        out: list[Resolved] = []
        glob = [m for m in self.table if "{L}" not in m.megatron]
        out.append(self.resolve(glob[0].megatron))  # embedding
        for layer in range(self.cfg.num_layers):
            for m in self._layer_mappings(layer):
                if "{E}" in m.megatron:
                    for e in range(self.cfg.num_experts):
                        out.append(self.resolve(m.megatron.format(L=layer, E=e)))
                else:
                    out.append(self.resolve(m.megatron.format(L=layer)))
        out.extend(self.resolve(m.megatron) for m in glob[1:])
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
