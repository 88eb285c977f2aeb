"""``cpu.megatron.clip-grads-cpu``: gradient clipping without its ``torch.cuda.FloatTensor`` assertion."""

from __future__ import annotations

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """Megatron's function without its ``torch.cuda.FloatTensor`` assertion (fp32 is still required)."""
    from megatron.core.optimizer.clip_grads import to_local_if_dtensor

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = []
    for p in parameters:
        g = getattr(p, attr, None)
        if g is None:
            continue
        if not use_decoupled_grad and g.dtype != torch.float32:
            raise TypeError(f"clip_grad_by_total_norm_fp32 needs fp32 gradients, got {g.dtype}")
        grads.append(to_local_if_dtensor(g).detach())
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0 and grads:
        torch._foreach_mul_(grads, clip_coeff)


@implements("cpu.megatron.clip-grads-cpu")
def _clip_grads_cpu(patch: Patcher) -> None:
    patch.replace(clip_grad_by_total_norm_fp32,
                  "megatron.core.optimizer.clip_grads:clip_grad_by_total_norm_fp32",
                  "megatron.core.optimizer.optimizer:clip_grad_by_total_norm_fp32")
