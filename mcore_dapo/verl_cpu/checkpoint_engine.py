"""``actor_rollout_ref.rollout.checkpoint_engine.backend=gloo``: verl's weight transport between the trainer and a
rollout on its own processes (``trainer.v1.trainer_mode=separate_async``), over gloo, for hosts without an
accelerator; registered by naming this module in ``checkpoint_engine.custom_backend_module``.

:class:`GlooCheckpointEngine` follows verl's HCCL engine (``verl/checkpoint_engine/hccl_checkpoint_engine.py``):
the trainer's rank 0 sends to the rollout workers in a gloo group rebuilt at every sync, with verl's
``split_weight_chunks`` / ``merge_weight_chunks``. Two checks verl's engines do not make: every trainer rank walked
the same (name, shape, dtype) stream (a hash compared after the sync), and every byte arrived (the sender's hash
sent last; a receiver that computes another raises before its consumer commits). With ``MCORE_DAPO_SYNC_TRACE=F``
each side appends one JSON line per sync to ``F`` (side, rank, step, entries, bytes, hash). Why and how:
docs/VERL_PLUGIN.md, "Asynchronous modes".
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from verl.checkpoint_engine.base import (CheckpointEngine, CheckpointEngineRegistry, merge_weight_chunks,
                                         split_weight_chunks)

from mcore_dapo.verl_plugin.registrations import SYNC_TRACE_ENV

NAME = "gloo"

log = logging.getLogger(__name__)


@dataclass
class MasterMetadata:
    host: str
    port: int


class StreamHash:
    """blake2b over a weight stream: each tensor's (or chunk's) name, shape and dtype (``meta``) and, for the
    bytes sent, its data."""

    def __init__(self):
        import hashlib

        self._h = hashlib.blake2b(digest_size=16)
        self.entries = 0
        self.bytes = 0

    def meta(self, name: str, shape, dtype) -> None:
        self._h.update(repr((name, tuple(shape), str(dtype))).encode())
        self.entries += 1

    def data(self, chunk: torch.Tensor) -> None:
        self._h.update(chunk.contiguous().view(torch.uint8).numpy().tobytes())
        self.bytes += chunk.numel() * chunk.element_size()

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def record(side: str, rank: int, step, h: StreamHash, seconds: float) -> None:
    trace = os.environ.get(SYNC_TRACE_ENV)
    if not trace:
        return
    line = {"side": side, "rank": rank, "step": step, "entries": h.entries, "bytes": h.bytes,
            "hash": h.hexdigest(), "seconds": round(seconds, 3), "pid": os.getpid()}
    Path(trace).parent.mkdir(parents=True, exist_ok=True)
    with open(trace, "a") as f:
        f.write(json.dumps(line) + "\n")


def same_stream_on_every_rank(digest: str, group=None) -> None:
    """Raise when the trainer's ranks walked different weight streams (names, shapes, dtypes, order)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    digests = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) > 1:
        first = digests[0]
        bad = [r for r, d in enumerate(digests) if d != first]
        raise RuntimeError(f"the trainer's ranks {bad} yielded another weight stream than rank 0 (names, shapes, "
                           "dtypes or order differ): every rank must walk get_per_tensor_param in the same order")


@CheckpointEngineRegistry.register(NAME)
class GlooCheckpointEngine(CheckpointEngine):
    """Weights from the trainer's rank 0 to every rollout worker over a gloo group (see the module)."""

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0, **kwargs):
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout_s = float(timeout_s)
        self.rank = None
        self.world_size = None
        self.group = None
        self.store = None

    def prepare(self):
        if not self.is_master:
            return None
        from datetime import timedelta

        import ray
        import torch.distributed as dist

        host = ray.util.get_node_ip_address().strip("[]") if ray.is_initialized() else "127.0.0.1"
        # the store listens from here on, on a port the system gave it (port 0): a port found free, closed and
        # bound again later can be taken in between (another process's listener or outgoing connection: seen
        # once as EADDRINUSE at a run's first sync); the members connect to it in init_process_group
        self.store = dist.TCPStore(host, 0, None, is_master=True, timeout=timedelta(seconds=self.timeout_s),
                                   wait_for_workers=False)
        return MasterMetadata(host=host, port=int(self.store.port))

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list):
        world = rollout_world_size + 1
        actor = {"rank": [0] + [-1] * (actor_wg_world_size - 1), "world_size": [world] * actor_wg_world_size,
                 "master_metadata": [metadata[0]] * actor_wg_world_size}
        rollout = {"rank": list(range(1, world)), "world_size": [world] * rollout_world_size,
                   "master_metadata": [metadata[0]] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master_metadata: MasterMetadata):
        from datetime import timedelta

        import torch.distributed as dist

        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        timeout = timedelta(seconds=self.timeout_s)
        # a store and a group of their own: the trainer's processes already hold the default group (Megatron's);
        # the sender's store is the one prepare() opened
        if rank > 0:
            self.store = dist.TCPStore(master_metadata.host, master_metadata.port, world_size, is_master=False,
                                       timeout=timeout)
        elif self.store is None:
            raise RuntimeError("the gloo checkpoint engine's sender has no store: prepare() was not called on it")
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("mcore_dapo_ckpt", self.store), rank, world_size,
                                           timeout)
        self._broadcast(torch.ones(1, dtype=torch.uint8))  # every member is in before the first bucket

    def finalize(self):
        self.group = None
        self.store = None
        self.rank = self.world_size = None

    def _broadcast(self, t: torch.Tensor) -> None:
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.group.broadcast([t], opts).wait()

    def _send_object(self, obj) -> None:
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        self._broadcast(torch.tensor([data.numel()], dtype=torch.int64))
        self._broadcast(data)

    def _receive_object(self):
        n = torch.zeros(1, dtype=torch.int64)
        self._broadcast(n)
        data = torch.empty(int(n), dtype=torch.uint8)
        self._broadcast(data)
        return pickle.loads(data.numpy().tobytes())

    @torch.no_grad()
    async def send_weights(self, weights, global_steps: int | None = None):
        from verl.workers.rollout.utils import ensure_async_iterator

        t0, walked = time.time(), StreamHash()
        if self.rank is None or self.rank < 0:  # not a sender: the generator is collective, walk it
            async for name, weight in ensure_async_iterator(weights):
                walked.meta(name, weight.shape, weight.dtype)
            same_stream_on_every_rank(walked.hexdigest())
            return {}

        sent, exported = StreamHash(), StreamHash()
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        meta: list = []
        offset = 0

        def walk():  # the stream as verl's split_weight_chunks takes it, hashed on the way
            async def gen():
                async for name, weight in ensure_async_iterator(weights):
                    walked.meta(name, weight.shape, weight.dtype)
                    weight = weight.detach().to("cpu").contiguous()
                    exported.meta(name, weight.shape, weight.dtype)
                    exported.data(weight)
                    yield name, weight
            return gen()

        async for tensor_meta, chunk in split_weight_chunks(walk(), self.bucket_size):
            if offset + tensor_meta.chunk_size > self.bucket_size:
                self._send_object({"meta": meta, "is_last": False})
                self._broadcast(bucket)
                meta, offset = [], 0
            tensor_meta.offset = offset
            meta.append(tensor_meta)
            bucket[offset:offset + tensor_meta.chunk_size] = chunk
            sent.meta(tensor_meta.name, tensor_meta.shape, tensor_meta.dtype)
            sent.data(chunk)
            offset += tensor_meta.chunk_size
        sent.meta("end", (), torch.uint8)
        self._send_object({"meta": meta, "is_last": True, "hash": sent.hexdigest(), "bytes": sent.bytes})
        self._broadcast(bucket)
        seconds = time.time() - t0
        record("send", 0, global_steps, sent, seconds)
        record("export", 0, global_steps, exported, seconds)  # by tensor: what a consumer's commit hashes
        same_stream_on_every_rank(walked.hexdigest())
        log.info("gloo checkpoint engine: step %s, %d bytes in %.2f s", global_steps, sent.bytes, seconds)
        return {"timing_s/weight_sync_transport": seconds}

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None):
        async for name, weight in merge_weight_chunks(self._chunks(global_steps), self.bucket_size):
            yield name, weight

    async def _chunks(self, global_steps):
        if self.rank is None or self.rank <= 0:
            raise RuntimeError("the gloo checkpoint engine receives on the rollout's ranks (1..n) only")
        t0, got = time.time(), StreamHash()
        while True:
            head = self._receive_object()
            bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
            self._broadcast(bucket)
            for m in head["meta"]:
                chunk = bucket[m.offset:m.offset + m.chunk_size].clone()
                got.meta(m.name, m.shape, m.dtype)
                got.data(chunk)
                if m is head["meta"][-1] and head["is_last"]:
                    got.meta("end", (), torch.uint8)
                    self._check(head, got, global_steps, t0)
                yield m, chunk
            if head["is_last"]:
                if not head["meta"]:
                    got.meta("end", (), torch.uint8)
                    self._check(head, got, global_steps, t0)
                return

    def _check(self, head: dict, got: StreamHash, global_steps, t0: float) -> None:
        # before the last tensor reaches the consumer: a receiver that commits after the stream's end never
        # commits a stream whose bytes differ from what was sent
        record("receive", self.rank, global_steps, got, time.time() - t0)
        if got.hexdigest() != head["hash"] or got.bytes != head["bytes"]:
            raise RuntimeError(f"weights of step {global_steps} arrived corrupted: {got.bytes} bytes hashing to "
                               f"{got.hexdigest()}, sent {head['bytes']} bytes hashing to {head['hash']}; the "
                               "rollout keeps the weights it had")
