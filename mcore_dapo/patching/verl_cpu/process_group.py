"""``verl.cpu.process-group``: verl's two process-group initialisers on the ``cpu`` platform.

verl builds the backend string ``cpu:gloo,{device}:{backend}``, which torch refuses when the device
is the CPU (``cpu`` twice). On the ``cpu`` platform the backend is plain ``gloo``; on other platforms
verl's functions run unchanged. verl's workers import these functions by name
(``from verl.utils.distributed import ...``), so they are wrapped as soon as
``verl.utils.distributed`` has executed, before any importer can see it.
"""

from __future__ import annotations

import os
from datetime import timedelta

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "verl.utils.distributed"


def _on_cpu() -> bool:
    from mcore_dapo.host import on_cpu

    return on_cpu()


def _ray_init_on_cpu(original):
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and _on_cpu():
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    return initialize_global_process_group_ray


def _init_on_cpu(original):
    def initialize_global_process_group(timeout_second=36000):
        if not _on_cpu():
            return original(timeout_second)
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout_second),
                                    init_method=os.environ.get("DIST_INIT_METHOD", None))
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    return initialize_global_process_group


@implements("verl.cpu.process-group")
def _process_group(patch: Patcher) -> None:
    def install():
        patch.wrap(_ray_init_on_cpu, f"{MODULE}:initialize_global_process_group_ray")
        patch.wrap(_init_on_cpu, f"{MODULE}:initialize_global_process_group")

    patch.on_undo(after_import(MODULE, install))
