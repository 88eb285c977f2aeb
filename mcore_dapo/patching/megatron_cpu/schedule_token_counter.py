"""``cpu.megatron.schedule-token-counter``: megatron-core 0.12/0.13's pipeline schedules move their token
counter to the GPU with ``Tensor.cuda()``; while those two schedules run, ``Tensor.cuda()`` returns the
tensor itself (as during the dist-checkpoint exchange), restored when they return."""

from __future__ import annotations

from mcore_dapo.patching.megatron_cpu.dist_ckpt_exchange import _on_cpu
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.pipeline_parallel.schedules"


@implements("cpu.megatron.schedule-token-counter")
def _schedule_token_counter(patch: Patcher) -> None:
    patch.wrap(_on_cpu, f"{MODULE}:forward_backward_pipelining_without_interleaving")
    patch.wrap(_on_cpu, f"{MODULE}:forward_backward_pipelining_with_interleaving")
