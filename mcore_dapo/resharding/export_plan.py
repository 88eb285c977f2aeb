"""The export plan: which tensors go into which bucket, and where each byte lands. Built once, reused.

A *unit* is what one gather produces: one Megatron tensor split over TP (or
replicated), or, for experts, the ``EP`` experts that sit at the same local
index on every EP rank, each split over ETP. Every rank of a stage holds a
shard of the same shape for a unit, so a bucket's units pack into one flat
buffer per group and come back with one ``all_gather`` per group.

The plan is the same on every rank: it is computed from the bridge's tensor
list and from the local shapes and dtypes every pipeline stage reports once
(``all_gather_object`` over PP), plus each group's rank order (also gathered
once). HF shapes come from the mapping kinds' own ``to_hf`` run on meta
tensors, so no layout is re-implemented here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mcore_dapo.bridge import Bridge, Resolved
from mcore_dapo.bridge.mapping import Mapping
from mcore_dapo.resharding.comm import Comm

GATHER_OF_MAPPING = {"tp": "tp", "etp": "expert", None: None}


@dataclass(frozen=True)
class Piece:
    """One HF tensor in a bucket's output buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int  # elements

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class Member:
    """One Megatron tensor of a unit (one expert, or the whole unit)."""

    megatron: str  # canonical name
    ep_rank: int | None  # EP rank that holds it (experts only)
    pieces: list[Piece] = field(default_factory=list)


@dataclass
class Unit:
    mapping: Mapping
    gather: str | None  # "tp", "expert", or None (held whole by every rank of the stage)
    stage: int
    local_shape: tuple[int, ...]
    src_dtype: str
    members: list[Member]
    send_offset: int = 0  # elements, in this rank's row of the bucket's gather buffer for its group

    @property
    def local_numel(self) -> int:
        return torch.Size(self.local_shape).numel()

    @property
    def out_numel(self) -> int:
        return sum(p.numel for m in self.members for p in m.pieces)


@dataclass
class BucketPlan:
    index: int
    stage: int
    dtype: torch.dtype
    units: list[Unit] = field(default_factory=list)
    numel: int = 0  # output elements
    send_numel: dict[str, int] = field(default_factory=dict)  # per gather group, elements per rank

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def pieces(self) -> list[Piece]:
        return [p for u in self.units for m in u.members for p in m.pieces]


@dataclass
class ExportPlan:
    buckets: list[BucketPlan]
    sizes: dict[str, int]  # tp, etp, ep, pp
    tp_pos: list[int]  # tp rank -> rank in the TP group
    expert_pos: dict[tuple[int, int], int]  # (ep rank, etp rank) -> rank in the expert group
    pp_pos: list[int]  # stage -> rank in the PP group

    def hf_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        return [(p.name, p.shape, b.dtype) for b in self.buckets for p in b.pieces()]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def collectives_per_sync(self, stage: int, *, broadcast_pp: bool = True, checksums: bool = False) -> int:
        """What one sync issues on a rank of ``stage``: one per bucket and group the bucket needs.

        Gathers run on the bucket's own stage; the PP broadcast (and, with checksums,
        the broadcast of the checksums) involves every stage.
        """
        pp = self.sizes["pp"] > 1 and broadcast_pp
        return sum((b.stage == stage) * len(b.send_numel) + pp * (1 + checksums) for b in self.buckets)

    def per_tensor_collectives(self) -> int:
        """What a per-tensor exporter would issue: one collective per tensor and group it crosses.

        Per Megatron tensor: a PP broadcast (PP > 1) and a TP/ETP gather (when split);
        experts additionally one EP gather per local expert index (verl's per-tensor scheme).
        """
        n = 0
        for b in self.buckets:
            for u in b.units:
                split = u.mapping.split_dim is not None
                size = self.sizes["etp"] if u.mapping.group == "etp" else self.sizes["tp"]
                per_member = (self.sizes["pp"] > 1) + (split and size > 1)
                n += per_member * len(u.members) + (u.members[0].ep_rank is not None and self.sizes["ep"] > 1)
        return n


def _key(r: Resolved) -> tuple:
    """Experts of one layer and kind share a key (and a local shape): every EP rank holds some."""
    return (r.mapping.megatron, r.layer) if r.expert is not None else (r.megatron,)


def local_descriptors(local: dict[str, torch.Tensor], bridge: Bridge) -> dict[tuple, tuple]:
    out = {}
    for name, p in local.items():
        out.setdefault(_key(bridge.resolve(name)), (tuple(p.shape), str(p.dtype).removeprefix("torch.")))
    return out


def _hf_shapes(mapping: Mapping, local_shape, size: int, dims, cache: dict) -> list[tuple[int, ...]]:
    key = (mapping, local_shape, size)
    if key not in cache:
        shards = [torch.empty(local_shape, device="meta")] * size
        cache[key] = [tuple(t.shape) for t in mapping.to_hf(shards, dims)]
    return cache[key]


def _rank_orders(comm: Comm, info) -> tuple[list[int], dict, list[int]]:
    tp = comm.gather_objects("tp", info.tp_rank)
    ex = comm.gather_objects("expert", (info.ep_rank, info.etp_rank))
    pp = comm.gather_objects("pp", info.pp_rank)
    tp_pos = [tp.index(r) for r in range(len(tp))]
    return tp_pos, {c: i for i, c in enumerate(ex)}, [pp.index(s) for s in range(len(pp))]


def _units(bridge: Bridge, owners: dict, sizes: dict, comm: Comm) -> list[Unit]:
    nl = bridge.cfg.num_experts // sizes["ep"] if bridge.cfg.is_moe else 0
    cache, units, done = {}, [], set()
    for r in bridge.all_resolved:
        key = _key(r)
        if key not in owners:
            raise RuntimeError(f"no pipeline stage holds {r.megatron}: the model does not match its bridge")
        stage, local_shape, dtype = owners[key]
        gather = GATHER_OF_MAPPING[r.mapping.group]
        if gather is not None and comm.size(gather) == 1:
            gather = None
        split = sizes["etp"] if r.mapping.group == "etp" else sizes["tp"] if r.mapping.group else 1
        hf_shapes = _hf_shapes(r.mapping, local_shape, split, bridge.dims, cache)
        if r.expert is None:
            members = [Member(r.megatron, None)]
        else:
            ukey = (key, r.expert % nl)
            if ukey in done:
                continue
            done.add(ukey)
            experts = [ep * nl + r.expert % nl for ep in range(sizes["ep"])]
            members = [Member(r.mapping.megatron.format(L=r.layer, E=e), ep) for ep, e in enumerate(experts)]
        for m in members:
            m.pieces = [Piece(n, s, 0) for n, s in zip(bridge.resolve(m.megatron).hf, hf_shapes)]
        units.append(Unit(r.mapping, gather, stage, local_shape, dtype, members))
    return units


def _bucketize(units: list[Unit], bucket_bytes: int, dtype: torch.dtype | None) -> list[BucketPlan]:
    buckets: list[BucketPlan] = []
    for u in units:
        out_dtype = dtype or getattr(torch, u.src_dtype)
        b = buckets[-1] if buckets else None
        unit_bytes = u.out_numel * torch.empty((), dtype=out_dtype).element_size()
        full = b is not None and bool(b.units) and b.nbytes + unit_bytes > bucket_bytes
        if b is None or b.stage != u.stage or b.dtype != out_dtype or full:
            b = BucketPlan(len(buckets), u.stage, out_dtype)
            buckets.append(b)
        if u.gather is not None:
            u.send_offset = b.send_numel.get(u.gather, 0)
            b.send_numel[u.gather] = u.send_offset + u.local_numel
        for m in u.members:
            for i, p in enumerate(m.pieces):
                m.pieces[i] = Piece(p.name, p.shape, b.numel)
                b.numel += p.numel
        b.units.append(u)
    return buckets


def build_plan(local: dict[str, torch.Tensor], bridge: Bridge, info, comm: Comm, *,
               bucket_bytes: int, dtype: torch.dtype | None = None) -> ExportPlan:
    """The plan every rank shares; issues a few small collectives of metadata (once)."""
    stages = comm.gather_objects("pp", (info.pp_rank, local_descriptors(local, bridge)))
    owners: dict[tuple, tuple] = {}
    for stage, desc in sorted(stages, key=lambda s: s[0]):
        for key, (shape, dt) in desc.items():
            owners.setdefault(key, (stage, shape, dt))  # a tied output layer stays with the first stage
    sizes = {"tp": info.tp_size, "etp": info.etp_size, "ep": info.ep_size, "pp": info.pp_size}
    tp_pos, expert_pos, pp_pos = _rank_orders(comm, info)
    units = _units(bridge, owners, sizes, comm)
    return ExportPlan(_bucketize(units, bucket_bytes, dtype), sizes, tp_pos, expert_pos, pp_pos)
