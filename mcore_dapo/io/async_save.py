"""Checkpoint writes in the background: training waits for the copy to host memory, not for the disk.

One :class:`BackgroundWriter` per trainer process holds

* megatron-core's ``AsyncCallsQueue`` with a persistent checkpoint worker (one process spawned at the first
  save and reused: ``PersistentAsyncCaller`` in megatron/core/dist_checkpointing/strategies/async_utils.py,
  megatron-core 0.12.1 and 0.16.1), for what Megatron's ``dist_checkpointing.save(..., async_sharded_save=True)``
  returns (the optimizer's and the RNG states' shards);
* one thread for the other files of a save (the HF shards this rank owns, already staged in host memory).

A save ends in :meth:`BackgroundWriter.poll`, which every rank calls at the same points (collective): once
every rank's dist-checkpoint requests and threads are done, the save's last steps run on every rank (the
index, the record, the rename, the tracker: :mod:`mcore_dapo.verl_plugin.checkpoint`). A rank whose background
write raised makes every rank raise, naming it; the checkpoint stays in its ``.partial`` folder.

The worker process is spawned (not forked: the trainer may hold CUDA or Ray state) and prepares itself as a
trainer process does for the device (:func:`mcore_dapo.io.async_worker.writer_main`): MindSpeed before Megatron on Ascend, the CPU patches
of Megatron on the CPU, where megatron-core's worker would otherwise ask CUDA for a device. A host tensor is
copied once into shared memory by the trainer before the worker gets it (:func:`stage_host_tensors`), as the
device-to-host copy does on an accelerator, so that training cannot change what the checkpoint holds; a save's
requests go to the worker as one (:func:`combined`). The worker exits when its trainer process is gone.
"""

from __future__ import annotations

import atexit
import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

RUNNING, DONE, FAILED = 0, 1, 2


def _shared_copy(t):
    out = torch_empty_shared(t)
    out.copy_(t)
    return out


def torch_empty_shared(t):
    import torch

    return torch.empty(t.shape, dtype=t.dtype).share_memory_()


def stage_host_tensors(write_buckets):
    """Megatron's write buckets (``(file, key, (bytes, [(item, tensor)]))``) with every host tensor copied once
    into shared memory, in the trainer, before the request goes to the worker: the worker's preload
    (``tensor.to("cpu")``) would hand it the live tensor, which the next update changes; an accelerator's tensor
    stays for the worker's device-to-host copy, during which the trainer waits."""
    out = []
    for file_name, storage_key, (bytes_data, tensor_data) in write_buckets:
        tensor_data = [(item, _shared_copy(t) if t.device.type == "cpu" else t) for item, t in tensor_data]
        out.append((file_name, storage_key, (bytes_data, tensor_data)))
    return out


def _preload_all(preloads):
    return [p() if p is not None else None for p in preloads]


def _write_all(parts, preloaded, _unused=None):
    """One save's requests written one after the other by the worker (their preloads done first)."""
    for (fn, args, kwargs), buckets in zip(parts, preloaded):
        if fn is None:
            continue
        args = list(args)
        if buckets is not None:
            args[1] = buckets
        fn(*args, **kwargs)


def combined(requests):
    """A save's dist-checkpoint requests as one: megatron-core's persistent worker takes one request at a time and
    a trainer scheduling the next waits for the previous one's writes (``preload_q.join()`` behind them), so two
    requests of one save (verl's optimizer and RNG states) would block training for the first one's writes."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    parts, preloads, finalize = [], [], []
    for r in requests:
        args = list(r.async_fn_args)
        if r.preload_fn is not None:
            args[1] = stage_host_tensors(args[1])
            preload = functools.partial(*_rebind(r.preload_fn, args[1]))
        else:
            preload = None
        parts.append((r.async_fn, tuple(args), dict(r.async_fn_kwargs or {})))
        preloads.append(preload)
        finalize.extend(r.finalize_fns)
    return AsyncRequest(_write_all, (parts, None, None), finalize,
                        preload_fn=functools.partial(_preload_all, preloads))


def _rebind(preload_fn, buckets):
    """``functools.partial(preload_tensors, write_buckets, non_blocking)`` (megatron-core's, both lines) on the
    staged buckets."""
    if not isinstance(preload_fn, functools.partial) or not preload_fn.args:
        raise RuntimeError(f"unexpected preload function {preload_fn!r} of megatron-core's async save")
    return (preload_fn.func, buckets, *preload_fn.args[1:])


@dataclass
class PendingSave:
    """A save whose writes run in the background; its ``steps`` run in order on every rank once all are done
    (each may be collective)."""

    name: str
    steps: list[Callable[[], None]] = field(default_factory=list)
    futures: list[Future] = field(default_factory=list)
    calls: int = 0  # dist-checkpoint requests scheduled for it


class BackgroundWriter:
    def __init__(self, device: str):
        self.device = device
        self._queue = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self.pending: PendingSave | None = None
        self._warm: threading.Thread | None = None
        atexit.register(self.close)  # before multiprocessing's own exit handler, which would wait for the worker

    @property
    def queue(self):
        if self._queue is None:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue(persistent=True)
            from mcore_dapo.io.async_caller import PersistentCaller

            self._queue.persistent_caller = PersistentCaller(self.device)  # its worker prepared for the device
        return self._queue

    def start(self) -> None:
        """Spawn the worker now (it imports torch and Megatron while training goes on), not at the first save;
        and, in a thread, the results queue megatron-core's async file writer makes once per process (a
        multiprocessing manager: a process spawned by ``filesystem_async._get_write_results_queue``, seconds)."""
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        from mcore_dapo.versions import megatron_version

        self.queue.persistent_caller.start_worker()
        if megatron_version() < (0, 14, 0):  # megatron-core 0.12.1 forks it (quick; and a fork from a thread is not safe)
            filesystem_async._get_write_results_queue()
            return
        self._warm = threading.Thread(target=filesystem_async._get_write_results_queue, daemon=True)
        self._warm.start()

    def begin(self, name: str) -> PendingSave:
        if self._warm is not None:
            self._warm.join()
            self._warm = None
        if self.pending is not None:
            raise RuntimeError(f"checkpoint {self.pending.name} is still being written: poll(blocking=True) first")
        self.pending = PendingSave(name)
        return self.pending

    def schedule(self, requests: list) -> None:
        """The dist-checkpoint ``AsyncRequest`` s of the pending save, as one (:func:`combined`; collective: every
        rank schedules its own)."""
        if not requests:
            return
        self.queue.schedule_async_request(combined(requests))
        self.pending.calls += 1

    def submit(self, fn: Callable, *args) -> Future:
        """Background work of the pending save on this rank (the HF shards it writes)."""
        future = self._pool.submit(fn, *args)
        self.pending.futures.append(future)
        return future

    def poll(self, blocking: bool) -> bool:
        """Collective. Finish the pending save if every rank's writes are done (``blocking``: wait for them);
        True when no save is pending any more."""
        import torch
        import torch.distributed as dist

        if self.pending is None:
            return True
        if self._queue is not None and self._queue.get_num_unfinalized_calls():
            self._queue.maybe_finalize_async_calls(blocking=blocking)
            if self._queue.get_num_unfinalized_calls():
                return False
        if blocking:
            for f in self.pending.futures:
                f.exception()  # waits
        state = DONE
        for f in self.pending.futures:
            if not f.done():
                state = RUNNING
            elif f.exception() is not None:
                state = FAILED
                break
        flags = torch.tensor([state == RUNNING, state == FAILED], dtype=torch.int64)
        dist.all_reduce(flags)
        pending = self.pending
        if int(flags[1]):
            self.pending = None
            errors = [None] * dist.get_world_size()
            mine = next((repr(f.exception()) for f in pending.futures if f.done() and f.exception()), None)
            dist.all_gather_object(errors, mine)
            bad = {r: e for r, e in enumerate(errors) if e}
            raise RuntimeError(f"checkpoint {pending.name}: the background write failed on rank(s) "
                               f"{', '.join(f'{r} ({e})' for r, e in bad.items())}; it stays incomplete")
        if int(flags[0]):
            return False
        self.pending = None
        for step in pending.steps:
            step()
        return True

    def close(self) -> None:
        """At exit: the worker process stopped (a pending save not finished is left incomplete)."""
        self._pool.shutdown(wait=False)
        caller = self._queue.persistent_caller if self._queue is not None else None
        self._queue = None
        if caller is not None and caller.process is not None:
            caller.process.kill()  # megatron-core's close(abort=True) on 0.16.1; 0.12.1's close() waits for it
            caller.process.join()
            caller.process = None
