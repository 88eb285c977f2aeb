"""``cpu.torch.gloo-average``: ``all_reduce(op=AVG)`` on gloo, which torch 2.7.1's gloo refuses.

verl 0.9.1's engine workers average the loss over the data-parallel group with ``ReduceOp.AVG``
(``verl/workers/engine_workers.py``, ``_postprocess_output``). In that module only, ``torch`` is a
view of torch whose ``distributed.all_reduce`` does an AVG on a gloo group as a SUM divided by the
group's size; every other call goes to torch's own all_reduce unchanged.
"""

from __future__ import annotations

import torch

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements
from mcore_dapo.patching.views import ModuleView

MODULES = ("verl.workers.engine_workers",)

def all_reduce(tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
    dist = torch.distributed
    if op == dist.ReduceOp.AVG and dist.get_backend(group) == "gloo":
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
        if async_op:
            work.wait()
        tensor.div_(dist.get_world_size(group))
        return work
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)

# ``torch`` with the gloo-capable average; everything else is torch's own
VIEW = ModuleView(torch, distributed=ModuleView(torch.distributed, all_reduce=all_reduce))

@implements("cpu.torch.gloo-average")
def _gloo_average(patch: Patcher) -> None:
    for name in MODULES:
        patch.on_undo(after_import(name, lambda name=name: patch.replace(VIEW, f"{name}:torch")))
