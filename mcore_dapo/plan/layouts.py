"""Layouts with their pipeline split, and the enumeration of every legal one for a model and world size.

Megatron splits the layers evenly over the pipeline stages unless
``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``
are set; then the middle stages share the rest evenly. :meth:`PlanLayout.chunks`
reproduces Megatron's placement (``get_num_layers_to_build`` and
``get_transformer_layer_offset`` of megatron-core 0.16), interleaved virtual
stages included, so the per-rank predictions know which global layers a rank holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

from mcore_dapo.bridge import HFModelConfig, Layout
from mcore_dapo.errors import UserError


@dataclass(frozen=True)
class PlanLayout:
    """The planner's candidate: a :class:`~mcore_dapo.bridge.layout.Layout` (the parallel sizes everything
    else runs under) with the layers of the first and last pipeline stages when they are uneven, and where
    each rank's layers fall (:meth:`chunks`)."""

    layout: Layout
    first: int | None = None  # layers in the first pipeline stage (uneven split)
    last: int | None = None  # layers in the last pipeline stage

    def describe(self) -> str:
        s = self.layout.describe()
        if self.first is not None:
            s += f" first{self.first}"
        if self.last is not None:
            s += f" last{self.last}"
        return s

    def as_dict(self) -> dict:
        d = self.layout.as_dict()
        d.update(first=self.first, last=self.last)
        return d

    def _per_stage(self, num_layers: int) -> tuple[int, int, int, int]:
        """(first, middle, last, middle stages): layers in each kind of stage."""
        pp = self.layout.pp
        if self.first is None and self.last is None:
            if num_layers % pp:
                raise UserError(
                    f"pp={pp} does not divide the {num_layers} layers: set the first/last stage sizes "
                    "(num_layers_in_first/last_pipeline_stage) or pick a PP that divides them"
                )
            m = num_layers // pp
            return m, m, m, pp
        f, lst = self.first or 0, self.last or 0
        mids = pp - (self.first is not None) - (self.last is not None)
        rest = num_layers - f - lst
        if mids < 0 or (mids == 0) != (rest == 0) or (mids and (rest <= 0 or rest % mids)):
            raise UserError(
                f"first={self.first} last={self.last} with pp={pp} leaves {rest} layers for {mids} middle "
                "stages: the middle stages must share the rest evenly"
            )
        m = rest // mids if mids else 0
        return (f if self.first is not None else m), m, (lst if self.last is not None else m), mids

    def chunks(self, num_layers: int, pp_rank: int) -> list[list[int]]:
        """Global layer indices of each model chunk (virtual stage) of ``pp_rank``, as Megatron places them."""
        pp, v = self.layout.pp, self.layout.vpp or 1
        f, m, lst, _ = self._per_stage(num_layers)
        n_rank = f if pp_rank == 0 else lst if pp_rank == pp - 1 else m
        if pp == 1:
            return [list(range(num_layers))]
        for what, n in (("first", f), ("middle", m), ("last", lst)):
            if n % v:
                raise UserError(f"vpp={v} does not divide the {n} layers of the {what} pipeline stage")
        per_chunk = n_rank // v
        fc, mc, lc = f // v, m // v, lst // v
        total = fc + mc * (pp - 2) + lc  # layers of one virtual round over all stages
        out = []
        for vp in range(v):
            off = vp * total + (0 if pp_rank == 0 else fc + (pp_rank - 1) * mc)
            out.append(list(range(off, off + per_chunk)))
        return out

    def validate(self, cfg: HFModelConfig, world_size: int | None = None) -> "PlanLayout":
        self.layout.validate(cfg, world_size)
        if self.layout.pp == 1 and (self.first is not None or self.last is not None):
            raise UserError("first/last pipeline stage sizes need pp > 1")
        for r in range(self.layout.pp):
            if not sum(len(c) for c in self.chunks(cfg.num_layers, r)):
                raise UserError(f"pipeline stage {r} of {self.describe()} has no layer")
        return self


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _splits(num_layers: int, pp: int, vpp: int) -> Iterator[tuple[int | None, int | None]]:
    """Even split when legal, plus near-even uneven first/last stages (within 2 layers of the mean)."""
    if num_layers % pp == 0:
        yield None, None
    if pp == 1:
        return
    mean = num_layers / pp
    lo, hi = max(vpp, math.floor(mean) - 2), math.ceil(mean) + 2
    for f in range(lo, hi + 1):
        for lst in range(lo, hi + 1):
            rest, mids = num_layers - f - lst, pp - 2
            if f % vpp or lst % vpp or (f == lst and num_layers % pp == 0 and f == num_layers // pp):
                continue
            if (mids == 0 and rest == 0) or (mids > 0 and rest > 0 and rest % mids == 0 and (rest // mids) % vpp == 0):
                yield f, lst


def enumerate_layouts(cfg: HFModelConfig, world_size: int, *, max_pp: int = 16, max_vpp: int = 4,
                      max_cp: int = 8) -> list[PlanLayout]:
    """Every legal layout for ``world_size`` devices (DP and expert-DP derived).

    With EP = 1 Megatron (0.16) marks expert weights as dense and reduces their gradients over the
    dense data-parallel group, which is right only when the experts are split like the rest: such
    layouts keep ETP = TP.
    """
    out = []
    experts = cfg.num_experts if cfg.is_moe else 1
    eff = cfg.moe_intermediate_size if cfg.is_moe else 1
    for tp in _divisors(cfg.num_key_value_heads, world_size):
        for cp in _divisors(max_cp, world_size // tp):
            for pp in range(1, min(max_pp, cfg.num_layers, world_size // (tp * cp)) + 1):
                if world_size % (tp * cp * pp):
                    continue
                for ep in _divisors(experts, world_size // pp):
                    for etp in _divisors(eff, world_size // (pp * ep)) if cfg.is_moe else [tp]:
                        if world_size % (etp * ep * pp) or (ep == 1 and etp != tp):
                            continue
                        for vpp in [None] + (list(range(2, max_vpp + 1)) if pp > 1 else []):
                            for first, last in _splits(cfg.num_layers, pp, vpp or 1):
                                pl = PlanLayout(Layout(tp=tp, pp=pp, ep=ep, etp=etp, cp=cp, vpp=vpp), first, last)
                                try:
                                    out.append(pl.validate(cfg, world_size))
                                except UserError:
                                    continue
    return out
