"""Mapping kinds between HF tensors and Megatron-core parameters.

Each kind knows both directions and its own tensor-parallel split:

* ``to_megatron(hf, rank, size)``: the HF tensors (full) -> this rank's shard.
* ``to_hf(shards)``: every rank's shard, in rank order -> the HF tensors (full).

``rank``/``size`` are those of the group the kind names (``"tp"`` for dense
weights, ``"etp"`` for experts, ``None`` for replicated ones); process groups
are never read from global state here, so the same code serves the converters,
the rollout export and verification.

Each entry also declares its HF shapes, in symbols the model's table defines
(``"hidden"``, ``"ffn"``, ...), and the part of the model it belongs to:
``"common"`` (every layer, and the tensors outside the layers), ``"dense_mlp"``
(dense layers) or ``"moe"`` (MoE layers: router and experts).

:class:`FusedExperts` relates an HF model's in-memory tensor that holds a layer's
experts fused to the hub's per-expert tensors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

PARTS = ("common", "dense_mlp", "moe")


def pattern_rx(pattern: str) -> re.Pattern:
    """A name pattern with ``{L}`` (layer) / ``{E}`` (expert) placeholders as a regex with those groups."""
    rx = re.escape(pattern).replace(r"\{L\}", r"(?P<L>\d+)").replace(r"\{E\}", r"(?P<E>\d+)")
    return re.compile("^" + rx + "$")


def _cat(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """torch.cat, without a copy when there is only one piece (TP 1: export is then free)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


@dataclass(frozen=True)
class Dims:
    """Model sizes the mapping kinds need."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int


@dataclass(frozen=True)
class Mapping:
    megatron: str  # canonical Megatron name pattern, with {L} (global layer) and {E} (global expert)
    hf: tuple[str, ...]  # HF name patterns, same placeholders
    shapes: tuple[tuple[str, ...], ...]  # each HF tensor's shape, in the table's size symbols
    group: str | None = None  # "tp", "etp" or None (replicated)
    split_dim: int | None = None
    part: str = "common"  # one of PARTS

    def __post_init__(self):
        if self.part not in PARTS or len(self.shapes) != len(self.hf):
            raise ValueError(f"mapping {self.megatron}: part {self.part!r} (accepted: {PARTS}), "
                             f"{len(self.shapes)} shapes for {len(self.hf)} HF names")

    @property
    def per_layer(self) -> bool:
        return "{L}" in self.megatron

    @property
    def per_expert(self) -> bool:
        """One tensor per expert (expert-parallel), as opposed to dense ones (the router among them)."""
        return "{E}" in self.megatron

    def hf_shapes(self, sizes: dict[str, int]) -> list[tuple[int, ...]]:
        """The HF tensors' shapes, ``sizes`` giving each size symbol's value."""
        return [tuple(sizes[d] for d in shape) for shape in self.shapes]

    def to_megatron(self, hf: list[torch.Tensor], rank: int, size: int, dims: Dims) -> torch.Tensor:
        (t,) = hf
        if self.split_dim is None or size == 1:
            return t
        return t.chunk(size, dim=self.split_dim)[rank]

    def to_hf(self, shards: list[torch.Tensor], dims: Dims) -> list[torch.Tensor]:
        if self.split_dim is None or len(shards) == 1:
            return [shards[0]]
        return [_cat(shards, self.split_dim)]

    def local_shape(self, hf_shapes: list[tuple[int, ...]], size: int, dims: Dims) -> tuple[int, ...]:
        """Shape of one rank's shard, from the HF shapes (no data needed)."""
        (s,) = hf_shapes
        s = list(s)
        if self.split_dim is not None:
            s[self.split_dim] //= size
        return tuple(s)


def replicated(megatron: str, hf: str, shape: tuple[str, ...], part: str = "common") -> Mapping:
    return Mapping(megatron, (hf,), (shape,), part=part)


def row(megatron: str, hf: str, shape: tuple[str, ...], group: str = "tp", part: str = "common") -> Mapping:
    return Mapping(megatron, (hf,), (shape,), group, 1, part)


@dataclass(frozen=True)
class VocabMapping(Mapping):
    """Vocab-parallel embedding / output layer: pad rows to the padded vocab, split rows."""

    def to_megatron(self, hf, rank, size, dims):
        (t,) = hf
        pad = dims.padded_vocab_size - t.shape[0]
        if pad:
            t = torch.cat([t, t.new_zeros((pad,) + tuple(t.shape[1:]))], dim=0)
        return t.chunk(size, dim=0)[rank]

    def to_hf(self, shards, dims):
        return [_cat(shards, 0)[: dims.vocab_size]]

    def local_shape(self, hf_shapes, size, dims):
        (s,) = hf_shapes
        return (dims.padded_vocab_size // size,) + tuple(s[1:])


def vocab(megatron: str, hf: str) -> Mapping:
    return VocabMapping(megatron, (hf,), (("vocab", "hidden"),), "tp", 0)


@dataclass(frozen=True)
class QKVMapping(Mapping):
    """q/k/v -> Megatron's fused ``linear_qkv``, interleaved per KV group.

    For each KV group g the fused weight holds ``[q heads of g; k_g; v_g]``;
    TP ranks hold whole groups, so a contiguous split of the fused weight is a
    rank's shard (TP must divide the groups).
    """

    def _fuse(self, q, k, v, dims):
        g, d = dims.num_query_groups, dims.head_dim
        per = dims.num_attention_heads // g
        h = q.shape[-1] if q.dim() == 2 else None
        tail = (h,) if h is not None else ()
        q = q.reshape(g, per * d, *tail)
        k = k.reshape(g, d, *tail)
        v = v.reshape(g, d, *tail)
        return torch.cat([q, k, v], dim=1).reshape(g * (per + 2) * d, *tail)

    def to_megatron(self, hf, rank, size, dims):
        q, k, v = hf
        fused = self._fuse(q, k, v, dims)
        return fused.chunk(size, dim=0)[rank]

    def to_hf(self, shards, dims):
        fused = _cat(shards, 0)
        g, d = dims.num_query_groups, dims.head_dim
        per = dims.num_attention_heads // g
        tail = tuple(fused.shape[1:])
        x = fused.reshape(g, (per + 2) * d, *tail)
        q, k, v = torch.split(x, [per * d, d, d], dim=1)
        return [t.reshape(-1, *tail) for t in (q, k, v)]

    def local_shape(self, hf_shapes, size, dims):
        rows = sum(s[0] for s in hf_shapes)
        return (rows // size,) + tuple(hf_shapes[0][1:])


def qkv(megatron: str, q: str, k: str, v: str) -> Mapping:
    return QKVMapping(megatron, (q, k, v), (("q_dim", "hidden"), ("kv_dim", "hidden"), ("kv_dim", "hidden")), "tp", 0)


@dataclass(frozen=True)
class GatedMLPMapping(Mapping):
    """gate_proj + up_proj -> ``linear_fc1``: each rank holds ``[gate shard; up shard]``.

    Splitting ``cat([gate; up])`` contiguously would hand rank 0 all of gate and
    rank 1 all of up, which is wrong for SwiGLU; gate and up are split first.
    """

    def to_megatron(self, hf, rank, size, dims):
        gate, up = hf
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)

    def to_hf(self, shards, dims):
        halves = [s.chunk(2, dim=0) for s in shards]
        return [_cat([h[0] for h in halves], 0), _cat([h[1] for h in halves], 0)]

    def local_shape(self, hf_shapes, size, dims):
        return (2 * hf_shapes[0][0] // size,) + tuple(hf_shapes[0][1:])


def gated_mlp(megatron: str, gate: str, up: str, width: str, group: str = "tp", part: str = "common") -> Mapping:
    """``width``: the size symbol of the MLP's ffn width (gate and up are ``[width, hidden]``)."""
    return GatedMLPMapping(megatron, (gate, up), ((width, "hidden"),) * 2, group, 0, part)


@dataclass(frozen=True)
class FusedExperts:
    """An HF in-memory tensor holding one layer's experts fused, ``[E, rows, ...]``: expert ``e``'s
    rows are its hub tensors ``hf`` (per-expert name patterns, ``{E}``) one after the other."""

    name: str  # name pattern, with {L}
    hf: tuple[str, ...]

    def hub_slices(self, name: str, shape: tuple[int, ...]) -> dict[str, tuple] | None:
        """Hub name -> index of that tensor in the fused tensor ``name`` of ``shape``; None for another name."""
        m = pattern_rx(self.name).match(name)
        if m is None:
            return None
        rows = shape[1] // len(self.hf)
        return {p.format(**m.groupdict(), E=e): (e, slice(j * rows, (j + 1) * rows))
                for e in range(shape[0]) for j, p in enumerate(self.hf)}
