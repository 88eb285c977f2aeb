"""The background writer (:mod:`mcore_dapo.io.async_save`) on its own, under torchrun.

``torchrun --nproc-per-node 2 -m mcore_dapo_checks.check_async_save --work W``

Each rank holds a tensor of its own values, saved with Megatron's ``dist_checkpointing.save(...,
async_sharded_save=True)`` through the writer's persistent worker; right after the request is scheduled the
tensor is changed in place (the next update), then the save is finished (``poll(blocking=True)``) and loaded
back: what was saved must be the values at the save. Then a save whose background part raises on the last
rank: every rank's poll must raise, naming that rank, and the save's last steps must not run. Rank 0's result:
``saved_is_at_save`` / ``saved_is_after_change`` (the loaded values against each), ``steps_run``,
``failure`` (each rank's message), ``worker_pid`` (the one worker process, the same for both saves).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

N = 1 << 20


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
    folder = Path(a.work) / "ckpt"
    if rank == 0:
        folder.mkdir(parents=True)
    dist.barrier()
    weights = torch.arange(N, dtype=torch.float32) + rank * N  # this rank's values at the save
    at_save = weights.clone()
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
    loaded = dist_checkpointing.load(
        {"w": ShardedTensor.from_rank_offsets("w", torch.empty(N), (0, rank, world))}, str(folder))["w"]
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
    out = {"saved_is_at_save": bool(torch.equal(loaded, at_save)), "saved_is_after_change": bool(
        torch.equal(loaded, weights)), "steps_run": steps, "failure": failures, "worker_pid": worker, "nothing_to_write": nothing,
        "pending_after_failure": writer.pending is not None}
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
