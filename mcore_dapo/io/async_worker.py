"""The background checkpoint writer's worker process (spawned by :class:`mcore_dapo.io.async_caller.PersistentCaller`):
prepared as a trainer process of the device is, then megatron-core's loop. This module imports nothing of Megatron
before the device is prepared (MindSpeed before Megatron on Ascend)."""

from __future__ import annotations

import os
import threading


def write_nothing() -> None:
    """A rank's background write when it has nothing to write."""


def _exit_with_parent(parent: int) -> None:
    def watch():
        import time

        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)  # the trainer is gone (killed): what was not finalized stays a .partial folder

    threading.Thread(target=watch, daemon=True).start()


def writer_main(device: str, parent: int, *loop_args) -> None:
    """The persistent worker's process: prepared as a trainer of ``device`` is, then megatron-core's loop."""
    _exit_with_parent(parent)
    from mcore_dapo.devices import get_adapter
    from mcore_dapo.patching import load_implementations, registry

    adapter = get_adapter(device)
    adapter.prepare()
    load_implementations()
    registry.apply(adapter.name, "megatron-core")
    from megatron.core.dist_checkpointing.strategies.async_utils import PersistentAsyncCaller

    PersistentAsyncCaller.async_loop(*loop_args)
