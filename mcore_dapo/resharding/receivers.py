"""Consumers of a weight sync: anything with ``load_weights(iterable of (hf_name, tensor))``.

vLLM's models have that method already. :class:`HFQwen3MoeReceiver` gives an
HF transformers Qwen3 / Qwen3-MoE model the same interface (the rollout side
of the CPU tests, and a reference consumer). transformers 5 holds the experts
of a layer fused in memory while the names sent are the hub's per-expert ones;
the receiver maps each hub name to its slice of the fused parameter
(the model's ``hub_slices``, :func:`mcore_dapo.bridge.models.get_model`). Models with per-expert modules
(transformers 4) map one to one.

Optional methods that :func:`~mcore_dapo.resharding.transfer.sync_weights` uses
when a receiver has them: ``expected_weights()`` (hub name -> shape, checked
before anything is written) and ``read_weight(name)`` (what the receiver holds
now, in the hub layout, for checksums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from mcore_dapo.bridge.models import get_model
from mcore_dapo.errors import UserError


@dataclass(frozen=True)
class _Target:
    param: torch.nn.Parameter
    index: tuple = ()  # where the hub tensor lies in the parameter (an expert's slice of a fused one)

    def view(self) -> torch.Tensor:
        return self.param.data[self.index]


def hub_slices_of(model: torch.nn.Module):
    """The ``hub_slices`` of an HF model's family (its config's architectures, else its model_type)."""
    return get_model(model.config.to_dict()).hub_slices


def _targets(model: torch.nn.Module) -> dict[str, _Target]:
    hub_slices = hub_slices_of(model)
    return {hub: _Target(p, index) for name, p in model.named_parameters()
            for hub, index in hub_slices(name, tuple(p.shape)).items()}


class HFQwen3MoeReceiver:
    """``load_weights`` for an HF transformers Qwen3(-MoE) model, with hub (per-expert) names."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.targets = _targets(model)

    def expected_weights(self) -> dict[str, tuple[int, ...]]:
        return {n: tuple(t.view().shape) for n, t in self.targets.items()}

    def read_weight(self, name: str) -> torch.Tensor:
        return self.targets[name].view()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy every ``(name, tensor)``; the whole call is checked first, so a bad one writes nothing."""
        items = list(weights)
        for name, t in items:
            if name not in self.targets:
                raise UserError(f"tensor {name!r} does not exist in the receiving model; nothing was written")
            have = tuple(self.targets[name].view().shape)
            if have != tuple(t.shape):
                raise UserError(
                    f"tensor {name!r} has shape {list(t.shape)} but the receiving model holds {list(have)}; "
                    "nothing was written"
                )
        for name, t in items:
            self.targets[name].view().copy_(t)
        return {name for name, _ in items}
