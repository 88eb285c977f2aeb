"""megatron-core's persistent checkpoint worker, spawned prepared for the trainer's device (used by
:class:`mcore_dapo.io.async_save.BackgroundWriter`). Importing this module imports megatron-core: the device is
prepared first (MindSpeed before Megatron on Ascend)."""

from __future__ import annotations

import multiprocessing as mp
import os

import torch.distributed as dist

from mcore_dapo.devices import get_adapter

get_adapter().prepare()

from megatron.core.dist_checkpointing.strategies import async_utils  # noqa: E402

from mcore_dapo.io.async_worker import write_nothing, writer_main  # noqa: E402


class PersistentCaller(async_utils.PersistentAsyncCaller):
    """megatron-core's ``PersistentAsyncCaller`` whose worker runs :func:`~mcore_dapo.io.async_worker.writer_main`
    for ``device`` (the rest of the class, queues and completion checks included, is megatron-core's)."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device

    def start_worker(self) -> None:
        if self.process is None:
            ctx = mp.get_context("spawn")
            self.process = ctx.Process(target=writer_main, args=(
                self.device, os.getpid(), dist.get_rank(), self.queue, self.preload_q, self.comp_q,
                async_utils.logger.getEffectiveLevel()))
            self.process.start()

    def schedule_async_call(self, async_req) -> None:
        if async_req.async_fn is None:
            # nothing for this rank to write (under fully_reshardable's memory-efficient gather only each
            # data-parallel group's rank 0 writes): megatron-core's caller returns without telling its
            # worker, whose completion queue then never answers a worker started beforehand; a no-op does
            async_req = async_req._replace(async_fn=write_nothing, async_fn_args=(), async_fn_kwargs={},
                                           preload_fn=None)
        self.start_worker()
        super().schedule_async_call(async_req)
