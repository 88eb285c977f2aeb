"""The process groups an export gathers over, and a counter of every collective it issues.

Three groups matter, all passed in (never read from global state by the plan or
the exporter): ``tp`` (dense weights split by tensor parallelism), ``expert``
(Megatron's expert-tensor-and-model-parallel group, EP x ETP: every expert
shard of a stage) and ``pp`` (pipeline stages). :meth:`Groups.from_megatron`
takes them from Megatron's parallel state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

GROUP_NAMES = ("tp", "expert", "pp")


@dataclass
class Groups:
    tp: object | None = None
    expert: object | None = None
    pp: object | None = None

    @classmethod
    def from_megatron(cls) -> "Groups":
        from megatron.core import parallel_state as ps

        return cls(
            tp=ps.get_tensor_model_parallel_group(),
            expert=ps.get_expert_tensor_and_model_parallel_group(),
            pp=ps.get_pipeline_model_parallel_group(),
        )

    def get(self, name: str):
        return getattr(self, name)

    def size(self, name: str) -> int:
        g = self.get(name)
        return 1 if g is None or not dist.is_initialized() else dist.get_world_size(g)


@dataclass
class CollectiveCounter:
    """Collectives issued, by group; ``bytes`` is what this rank put into them."""

    calls: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def add(self, group: str, nbytes: int) -> None:
        self.calls[group] += 1
        self.bytes[group] += nbytes

    def as_dict(self) -> dict:
        return {"total": self.total, "by_group": dict(self.calls), "bytes_by_group": dict(self.bytes)}


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False):
    # torch >= 2.12 names it all_gather_single; older torch (Ascend images) has only the old name
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


class Comm:
    """Counted collectives over named groups; a group of one issues nothing."""

    def __init__(self, groups: Groups, counter: CollectiveCounter | None = None):
        self.groups = groups
        self.counter = counter or CollectiveCounter()

    def size(self, name: str) -> int:
        return self.groups.size(name)

    def rank(self, name: str) -> int:
        g = self.groups.get(name)
        return 0 if self.size(name) == 1 else dist.get_rank(g)

    def all_gather_inplace(self, name: str, buf: torch.Tensor, async_op: bool = False):
        """``buf`` [size, n] holds this rank's part in row :meth:`rank`; fill the other rows (one collective).

        In place (the input is the output's own row), as Megatron's distributed optimizer
        gathers its parameter shards: no separate send buffer. ``async_op``: returns the
        work handle to ``wait()`` on (None for a group of one).
        """
        if self.size(name) == 1:
            return None
        mine = buf[self.rank(name)]
        work = _all_gather_flat(buf.view(-1), mine, self.groups.get(name), async_op)
        self.counter.add(name, mine.numel() * mine.element_size())
        return work

    def broadcast(self, name: str, t: torch.Tensor, src: int) -> None:
        """Broadcast ``t`` from group rank ``src`` (one collective)."""
        if self.size(name) == 1:
            return
        g = self.groups.get(name)
        dist.broadcast(t, src=dist.get_global_rank(g, src), group=g)
        self.counter.add(name, t.numel() * t.element_size())

    def gather_objects(self, name: str, obj) -> list:
        """Small metadata from every member, in group-rank order (used once, when planning)."""
        if self.size(name) == 1:
            return [obj]
        out = [None] * self.size(name)
        dist.all_gather_object(out, obj, group=self.groups.get(name))
        return out
