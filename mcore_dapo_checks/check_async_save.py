"""The background writer (:mod:`mcore_dapo.io.async_save`) on its own, under torchrun.

``torchrun --nproc-per-node 2 -m mcore_dapo_checks.check_async_save --work W``

Each rank holds a tensor of its own values, saved with Megatron's ``dist_checkpointing.save(...,
async_sharded_save=True)`` through the writer's persistent worker; right after the request is scheduled the
tensor is changed in place (the next update), then the save is finished (``poll(blocking=True)``) and loaded
back whole (every rank's shard) on every rank: what was saved must be, bit for bit, what each rank held at the
save. The reference is each rank's clone taken before the writer saw the tensor, and its crc32, gathered from
every rank. Then a save whose background part raises on the last rank: every rank's poll must raise, naming that
rank, and the save's last steps must not run. Rank 0's result: ``shards_at_save`` / ``shards_after_change``
(per rank of the save: its shard of the loaded tensor against its values at the save / after the change, as
every loading rank saw it), ``held_crc32`` / ``loaded_crc32`` (per shard), ``steps_run``, ``failure`` (each
rank's message), ``worker_pid`` (the one worker process, the same for both saves).

``MCORE_DAPO_MUTATE=skip-staging-rank1``: rank 1 hands the worker its live tensor (the writer's
``stage_host_tensors`` made the identity there, in this process only), which the next update then changes: the
check must fail for rank 1's shard. Unset: the product unchanged (the test launches this module).
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib
from pathlib import Path

N = 1 << 20


def crc32(t) -> str:
    """crc32 of a host tensor's bytes, computed here (not with the product's checksum)."""
    return f"{zlib.crc32(t.contiguous().numpy().tobytes()) & 0xFFFFFFFF:08x}"


def _mutate(kind: str, rank: int) -> None:
    from mcore_dapo.io import async_save

    if kind != "skip-staging-rank1":
        raise SystemExit(f"MCORE_DAPO_MUTATE={kind}: expected skip-staging-rank1")
    if rank == 1:
        async_save.stage_host_tensors = lambda buckets: buckets


def fail() -> None:
    raise OSError("disk full (the test's failing write)")


def run(a) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from mcore_dapo.bridge.layout import Layout
    from mcore_dapo.io.async_save import BackgroundWriter
    from mcore_dapo.runtime.parallel import init_parallel

    adapter = init_parallel(Layout(), a.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("MCORE_DAPO_MUTATE"):
        _mutate(os.environ["MCORE_DAPO_MUTATE"], rank)
    folder = Path(a.work) / "ckpt"
    if rank == 0:
        folder.mkdir(parents=True)
    dist.barrier()
    weights = torch.arange(N, dtype=torch.float32) + rank * N  # this rank's values at the save
    at_save = weights.clone()  # the reference, taken before the writer sees the tensor
    everyone = [torch.empty_like(at_save) for _ in range(world)]
    dist.all_gather(everyone, at_save)
    held = torch.cat(everyone)  # what every rank held at the save
    writer = BackgroundWriter(adapter.name)
    writer.start()
    steps: list[str] = []
    pending = writer.begin("test-1")
    request = dist_checkpointing.save({"w": ShardedTensor.from_rank_offsets("w", weights, (0, rank, world))},
                                      str(folder), async_sharded_save=True)
    writer.schedule([request])
    pending.steps.append(lambda: steps.append("finished-1"))
    weights.add_(1000.0)  # the next update, while the worker writes
    writer.poll(blocking=True)
    changed = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(changed, weights)
    # the whole tensor loaded back on every rank (every rank's shard, not the rank's own alone)
    loaded = dist_checkpointing.load({"w": ShardedTensor.from_rank_offsets("w", torch.empty(N * world),
                                                                          replica_id=rank)},
                                     str(folder))["w"]
    shards = loaded.view(world, N)
    mine = {"at_save": [bool(torch.equal(shards[r], held[r * N:(r + 1) * N])) for r in range(world)],
            "after_change": [bool(torch.equal(shards[r], changed[r])) for r in range(world)],
            "loaded_crc32": [crc32(shards[r]) for r in range(world)]}
    seen = [None] * world
    dist.all_gather_object(seen, mine)
    worker = writer.queue.persistent_caller.process.pid
    # a save where the last rank has nothing to write (its tensor is a replica of rank 0's)
    replica = Path(a.work) / "replica"
    if rank == 0:
        replica.mkdir()
    dist.barrier()
    pending = writer.begin("test-replica")
    request = dist_checkpointing.save({"r": ShardedTensor.from_rank_offsets("r", torch.full((16,), 7.0),
                                                                            replica_id=rank)},
                                      str(replica), async_sharded_save=True)
    nothing = [None] * world
    dist.all_gather_object(nothing, request.async_fn is None)
    writer.schedule([request])
    pending.steps.append(lambda: steps.append("finished-replica"))
    writer.poll(blocking=True)
    # a save whose background part fails on the last rank
    pending = writer.begin("test-2")
    writer.submit(fail if rank == world - 1 else (lambda: None))
    pending.steps.append(lambda: steps.append("finished-2"))
    try:
        writer.poll(blocking=True)
        failure = None
    except RuntimeError as e:
        failure = str(e)
    failures = [None] * world
    dist.all_gather_object(failures, failure)
    out = {"shards_at_save": [s["at_save"] for s in seen], "shards_after_change": [s["after_change"] for s in seen],
           "held_crc32": [crc32(held[r * N:(r + 1) * N]) for r in range(world)],
           "loaded_crc32": [s["loaded_crc32"] for s in seen], "steps_run": steps, "failure": failures,
           "worker_pid": worker, "nothing_to_write": nothing, "pending_after_failure": writer.pending is not None}
    writer.close()
    return out if rank == 0 else None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.check_async_save")
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
