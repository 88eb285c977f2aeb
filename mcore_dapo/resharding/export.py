"""The producer: a rank's Megatron model chunks -> buckets of ``(hf_name, full tensor)``.

Per bucket, on the pipeline stage that owns it:

1. pack this rank's shards of the bucket, cast to the export dtype, into its
   own row of one flat gather buffer per group;
2. one in-place, asynchronous ``all_gather`` per group (TP for dense weights,
   EP x ETP for experts) fills the other rows, while the tensors every rank
   holds whole are copied into the output;
3. assemble every other HF tensor into the bucket's flat output buffer with the
   mapping kinds' ``to_hf`` (QKV de-interleave, gate/up split, vocab padding
   dropped, experts under their global names), then free the gather buffers;

then one broadcast of the output buffer over PP, so that every rank yields
every tensor (``broadcast_pp=False``: each stage yields only its own buckets,
no PP collective). Peak extra memory is about two buckets (gather buffers +
output buffer; the gather buffers are slightly larger where the vocab is
padded), plus the largest single tensor while ``to_hf`` concatenates its shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from mcore_dapo.bridge import Bridge
from mcore_dapo.errors import UserError
from mcore_dapo.resharding.comm import Comm, CollectiveCounter, Groups
from mcore_dapo.resharding.export_plan import BucketPlan, ExportPlan, Member, Unit, build_plan
from mcore_dapo.resharding.verify import checksum

DEFAULT_BUCKET_BYTES = 1 << 30  # 1 GiB


@dataclass
class Bucket:
    index: int
    items: list[tuple[str, torch.Tensor]]  # views into one flat buffer: copy before the next bucket if kept
    buffer: torch.Tensor  # the flat buffer itself (what a transport hands over, e.g. as a CUDA IPC handle)
    checksums: dict[str, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


@dataclass
class SyncStats:
    tensors: int = 0
    bytes: int = 0
    buckets: int = 0
    seconds: float = 0.0
    peak_buffer_bytes: int = 0  # the exporter's own buffers, at most, during the sync
    collectives: CollectiveCounter = field(default_factory=CollectiveCounter)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("tensors", "bytes", "buckets", "seconds", "peak_buffer_bytes")}
        d["collectives"] = self.collectives.as_dict()
        return d


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP / Float16Module wrappers (their parameter names carry ``module.``)."""
    while hasattr(chunk, "module") and isinstance(chunk.module, torch.nn.Module):
        chunk = chunk.module
    return chunk


class _Buffers:
    """The exporter's buffers during one sync, with live-byte accounting.

    Gather buffers are pooled: one flat buffer holds a bucket's gather buffers of
    every group side by side; it is sized for the largest bucket, reused by every
    bucket of the sync and released with it (on the CPU a fresh large
    buffer costs a page fault per 4 KiB; on accelerators the caching allocator
    reuses memory anyway). Output buffers are fresh per bucket (the consumer owns
    them) or, with ``ring`` > 0, taken in turn from ``ring`` pooled buffers.
    """

    def __init__(self, stats: SyncStats, device, ring: int = 0):
        self.stats, self.device, self.live, self.ring, self.turn = stats, device, 0, ring, 0
        self.pool: dict[tuple, torch.Tensor] = {}

    def output(self, numel: int, dtype, largest: int) -> torch.Tensor:
        if not self.ring:
            return self.new(numel, dtype)
        key = ("out", self.turn % self.ring)
        self.turn += 1
        self.reserve(key, dtype, largest)
        return self.pool[(key, dtype)][:numel]

    def _count(self, t: torch.Tensor) -> torch.Tensor:
        self.live += t.numel() * t.element_size()
        self.stats.peak_buffer_bytes = max(self.stats.peak_buffer_bytes, self.live)
        return t

    def new(self, numel: int, dtype) -> torch.Tensor:
        return self._count(torch.empty(numel, dtype=dtype, device=self.device))

    def free(self, t: torch.Tensor) -> None:
        self.live -= t.numel() * t.element_size()

    def reserve(self, key, dtype, numel: int) -> None:
        have = self.pool.get((key, dtype))
        if have is None or have.numel() < numel:
            if have is not None:
                self.free(have)
            self.pool[(key, dtype)] = self.new(numel, dtype)

    def gather_buffers(self, dtype, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
        """A bucket's gather buffers (one per group), side by side in the one pooled gather buffer."""
        flat, out, at = self.pool[("gather", dtype)], [], 0
        for rows, cols in shapes:
            out.append(flat[at:at + rows * cols].view(rows, cols))
            at += rows * cols
        return out

    def release(self) -> None:
        for t in self.pool.values():
            self.free(t)
        self.pool.clear()


class WeightExporter:
    """Streams the model's weights as HF tensors, in buckets, from any TP/PP/EP/ETP layout.

    ``chunks``: this rank's model chunks (wrapped or not); ``info``: its
    :class:`~mcore_dapo.runtime.parallel.ParallelInfo`; ``groups``: the process
    groups (default: Megatron's); ``dtype``: cast to this dtype (``None`` keeps
    the parameters' dtype); ``output_ring``: 0 gives every bucket a fresh output
    buffer that the consumer owns; ``n`` > 0 reuses ``n`` buffers in turn, so a
    bucket's tensors stay valid only until ``n`` more buckets are requested (1 for
    a consumer that copies in ``load_weights``, 2 for a transport that loads one
    bucket while the next is filled); ``tensors``: what is exported of each parameter
    (default: the parameter itself; ``lambda p: p.main_grad`` exports the gradients, under
    the same HF names, through the same gathers). The plan is built on the first sync and reused.
    """

    def __init__(self, chunks, bridge: Bridge, info, *, groups: Groups | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype: torch.dtype | None = None,
                 broadcast_pp: bool = True, output_ring: int = 0, tensors=None):
        from mcore_dapo.runtime.model import local_params

        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise UserError(f"bucket_bytes={bucket_bytes!r} is not accepted: a positive number of bytes is")
        if not isinstance(output_ring, int) or output_ring < 0:
            raise UserError(f"output_ring={output_ring!r} is not accepted: 0 or a positive number of buffers is")
        self.bridge, self.info, self.dtype = bridge, info, dtype
        self.bucket_bytes, self.broadcast_pp, self.output_ring = bucket_bytes, broadcast_pp, output_ring
        self.groups = groups or Groups.from_megatron()
        self.local: dict[str, torch.nn.Parameter] = {}
        for lp in local_params([unwrap(c) for c in chunks], bridge, info):
            self.local.setdefault(lp.resolved.megatron, lp.param)  # a tied output copy is not exported twice
        if tensors is not None:
            self.local = {name: tensors(p) for name, p in self.local.items()}
        self.device = next(iter(self.local.values())).device
        self._plan: ExportPlan | None = None
        self.last_stats: SyncStats | None = None

    @property
    def plan(self) -> ExportPlan:
        if self._plan is None:
            self._plan = build_plan(self.local, self.bridge, self.info, Comm(self.groups),
                                    bucket_bytes=self.bucket_bytes, dtype=self.dtype)
        return self._plan

    def buckets(self, *, checksums: bool = False, progress: bool = False) -> Iterator[Bucket]:
        """One sync: every bucket this rank receives, in plan order. Collective: all ranks must iterate."""
        from tqdm import tqdm

        plan = self.plan
        stats = SyncStats()
        comm, mem = Comm(self.groups, stats.collectives), _Buffers(stats, self.device, self.output_ring)
        t0 = time.perf_counter()
        todo = [b for b in plan.buckets if self.broadcast_pp or b.stage == self.info.pp_rank]
        for b in todo:
            if b.stage == self.info.pp_rank:
                mem.reserve("gather", b.dtype, sum(comm.size(g) * n for g, n in b.send_numel.items()))
        largest = max((b.numel for b in todo), default=0)
        for bp in tqdm(todo, desc="weight sync", unit="bucket", disable=not progress, leave=False):
            bucket = self._bucket(bp, mem.output(bp.numel, bp.dtype, largest), comm, mem, checksums)
            stats.tensors += len(bucket.items)
            stats.bytes += bp.nbytes
            stats.buckets += 1
            if not mem.ring:
                mem.free(bucket.buffer)  # the consumer's now
            yield bucket
        mem.release()
        stats.seconds = time.perf_counter() - t0
        self.last_stats = stats

    def _bucket(self, bp: BucketPlan, out: torch.Tensor, comm: Comm, mem: _Buffers, checksums: bool) -> Bucket:
        """Fill ``out`` (the owner stage assembles it, the PP broadcast brings it to the others)."""
        sums, pieces = None, bp.pieces()
        if bp.stage == self.info.pp_rank:
            self._assemble(bp, out, comm, mem)
            if checksums:
                sums = torch.tensor([checksum(out[p.offset:p.offset + p.numel]) for p in pieces])
        if self.broadcast_pp:
            src = self.plan.pp_pos[bp.stage]
            comm.broadcast("pp", out, src)
            if checksums:
                sums = (sums if sums is not None else torch.zeros(len(pieces), dtype=torch.long)).to(self.device)
                comm.broadcast("pp", sums, src)
        items = [(p.name, out[p.offset:p.offset + p.numel].view(p.shape)) for p in pieces]
        named = None if sums is None else {p.name: int(v) for p, v in zip(pieces, sums.cpu().tolist())}
        return Bucket(bp.index, items, out, named)

    def iter_weights(self, **kw) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` one at a time (what ``load_weights`` takes), bucketed underneath."""
        for b in self.buckets(**kw):
            yield from b.items

    def _assemble(self, bp: BucketPlan, out: torch.Tensor, comm: Comm, mem: _Buffers) -> None:
        """Gathers started first; units held whole are copied while they run."""
        recv, works = {}, []
        groups = list(bp.send_numel)
        bufs = mem.gather_buffers(bp.dtype, [(comm.size(g), bp.send_numel[g]) for g in groups])
        for group, buf in zip(groups, bufs):
            mine = buf[comm.rank(group)]
            for u in bp.units:
                if u.gather == group:
                    mine[u.send_offset:u.send_offset + u.local_numel].view(u.local_shape).copy_(self._mine(u).data)
            works.append(comm.all_gather_inplace(group, buf, async_op=True))
            recv[group] = buf
        self._write(out, [u for u in bp.units if u.gather is None], recv)
        for w in works:
            if w is not None:
                w.wait()
        self._write(out, [u for u in bp.units if u.gather is not None], recv)

    def _write(self, out: torch.Tensor, units: list[Unit], recv: dict) -> None:
        for u in units:
            for m in u.members:
                hf = u.mapping.to_hf(self._shards(u, m, recv), self.bridge.dims)
                for piece, t in zip(m.pieces, hf):
                    out[piece.offset:piece.offset + piece.numel].view(piece.shape).copy_(t)

    def _mine(self, u: Unit) -> torch.nn.Parameter:
        """This rank's parameter of the unit (for experts: the one at this rank's EP position)."""
        m = u.members[0] if u.members[0].ep_rank is None else u.members[self.info.ep_rank]
        return self.local[m.megatron]

    def _shards(self, u: Unit, m: Member, recv: dict) -> list[torch.Tensor]:
        plan = self.plan
        if u.gather is None:
            return [self.local[m.megatron].data]
        buf = recv[u.gather]
        lo, hi = u.send_offset, u.send_offset + u.local_numel
        if u.gather == "tp":
            ranks = [plan.tp_pos[t] for t in range(plan.sizes["tp"])]
        else:
            ranks = [plan.expert_pos[(m.ep_rank or 0, t)] for t in range(plan.sizes["etp"])]
        return [buf[r, lo:hi].view(u.local_shape) for r in ranks]
