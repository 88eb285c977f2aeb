"""Consumers of a weight sync: anything with ``load_weights(iterable of (hf_name, tensor))``.

vLLM's models have that method already. :class:`HFQwen3MoeReceiver` gives an
HF transformers Qwen3 / Qwen3-MoE model the same interface (the rollout side
of the CPU tests, and a reference consumer). transformers 5 holds the experts
of a layer fused in memory, ``mlp.experts.gate_up_proj [E, 2I, H]`` (gate
rows first, then up) and ``mlp.experts.down_proj [E, H, I]``, while the names
sent are the hub's per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``;
the receiver maps each hub name to its slice of the fused parameter. Models
with per-expert modules (transformers 4) map one to one.

Optional methods that :func:`~mcore_dapo.resharding.sync.sync_weights` uses
when a receiver has them: ``expected_weights()`` (hub name -> shape, checked
before anything is written) and ``read_weight(name)`` (what the receiver holds
now, in the hub layout, for checksums).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

import torch

from mcore_dapo.errors import UserError

_FUSED = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


@dataclass(frozen=True)
class _Target:
    param: torch.nn.Parameter
    expert: int | None = None  # index into a fused [E, ...] parameter
    rows: tuple[int, int] | None = None  # rows of the expert's slice (gate or up half of gate_up_proj)

    def view(self) -> torch.Tensor:
        t = self.param.data
        if self.expert is not None:
            t = t[self.expert]
        if self.rows is not None:
            t = t[self.rows[0]:self.rows[1]]
        return t


def _targets(model: torch.nn.Module) -> dict[str, _Target]:
    out: dict[str, _Target] = {}
    for name, p in model.named_parameters():
        m = _FUSED.match(name)
        if m is None:
            out[name] = _Target(p)
            continue
        prefix, experts = m.group("prefix"), p.shape[0]
        for e in range(experts):
            if m.group("kind") == "down_proj":
                out[f"{prefix}.{e}.down_proj.weight"] = _Target(p, e)
            else:
                half = p.shape[1] // 2
                out[f"{prefix}.{e}.gate_proj.weight"] = _Target(p, e, (0, half))
                out[f"{prefix}.{e}.up_proj.weight"] = _Target(p, e, (half, 2 * half))
    return out


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
