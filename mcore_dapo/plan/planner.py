"""Rank every legal layout by estimated step time among those whose memory fits, and say how to run the best."""

from __future__ import annotations

import time
from dataclasses import dataclass

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.errors import UserError
from mcore_dapo.plan.layouts import PlanLayout, enumerate_layouts
from mcore_dapo.plan.memory import StageMemory, estimate_memory
from mcore_dapo.plan.timing import StepTime, step_time
from mcore_dapo.plan.workload import Workload


@dataclass(frozen=True)
class Candidate:
    layout: PlanLayout
    memory: list[StageMemory]
    time: StepTime
    hbm_gib: float

    @property
    def peak_gib(self) -> float:
        return max(s.peak for s in self.memory)

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.hbm_gib

    def as_dict(self, world: int) -> dict:
        lay = self.layout.layout
        return {
            "layout": self.layout.describe(),
            **self.layout.as_dict(),
            "dp": lay.dp(world),
            "expert_dp": lay.expert_dp(world),
            "fits": self.fits,
            "peak_gib": round(self.peak_gib, 2),
            "memory": [s.as_dict() for s in self.memory],
            "time": self.time.as_dict(),
        }


def evaluate(cfg: HFModelConfig, pl: PlanLayout, w: Workload) -> Candidate:
    return Candidate(pl, estimate_memory(cfg, pl, w), step_time(cfg, pl, w), w.device.hbm_gib)


def rank_key(c: Candidate):
    """Fitting layouts first, fastest first (then the smaller peak); the others closest to fitting first;
    ties go to the simpler layout."""
    lay = c.layout.layout
    uneven = c.layout.first is not None or c.layout.last is not None
    speed, size = round(c.time.total_s, 3), round(c.peak_gib, 1)
    return (not c.fits, *((speed, size) if c.fits else (size, speed)), lay.pp, lay.vpp or 1, uneven, lay.cp,
            lay.tp, lay.expert_tp)


def plan(cfg: HFModelConfig, w: Workload, progress=None) -> list[Candidate]:
    """Every legal layout, evaluated and ranked (best first)."""
    layouts = enumerate_layouts(cfg, w.world_size)
    if not layouts:
        raise UserError(
            f"no legal layout for {w.world_size} devices: the world size must be a multiple of the pipeline, "
            "tensor and expert sizes the model accepts"
        )
    out, last = [], time.monotonic()
    for i, pl in enumerate(layouts):
        out.append(evaluate(cfg, pl, w))
        if progress and time.monotonic() - last > 1.0:
            progress(f"evaluated {i + 1}/{len(layouts)} layouts")
            last = time.monotonic()
    return sorted(out, key=rank_key)


def without_dominated_cp(candidates: list[Candidate]) -> list[Candidate]:
    """Drop a CP > 1 layout when the same layout with another CP ranks before it and needs no more memory
    (context parallelism that buys nothing only adds communication)."""
    best: dict[tuple, Candidate] = {}
    out = []
    for c in candidates:
        lay = c.layout.layout
        key = (lay.tp, lay.pp, lay.ep, lay.expert_tp, lay.vpp, c.layout.first, c.layout.last)
        prev = best.get(key)
        if prev is not None and lay.cp > 1 and prev.fits >= c.fits and prev.peak_gib <= c.peak_gib + 1e-9:
            continue
        best.setdefault(key, c)
        out.append(c)
    return out


def stage_overrides(pl: PlanLayout) -> dict:
    """The TransformerConfig fields of the uneven first/last pipeline stage sizes that are set."""
    sizes = {"num_layers_in_first_pipeline_stage": pl.first, "num_layers_in_last_pipeline_stage": pl.last}
    return {k: v for k, v in sizes.items() if v is not None}


def layout_overrides(pl: PlanLayout) -> list[str]:
    """Hydra overrides of verl's Megatron actor and reference for a layout alone."""
    out = [x for role in ("actor", "ref") for x in pl.layout.hydra_overrides(f"actor_rollout_ref.{role}.megatron")]
    # uneven stages: set on the actor only; verl's reference inherits the actor's transformer overrides
    tc = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    return out + [f"{tc}.{k}={v}" for k, v in stage_overrides(pl).items()]


def verl_overrides(c: Candidate, w: Workload) -> list[str]:
    """Hydra overrides of verl's Megatron actor (and reference) for this layout and workload."""
    out = layout_overrides(c.layout)
    tc = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    if w.recompute == "full":
        out += [f"{tc}.recompute_granularity=full", f"{tc}.recompute_method=uniform", f"{tc}.recompute_num_layers=1"]
    elif w.recompute == "selective":
        out.append(f"{tc}.recompute_granularity=selective")
    opt = w.offload in ("optimizer", "param+optimizer")
    par = w.offload in ("param", "param+optimizer")
    out += [
        f"actor_rollout_ref.actor.megatron.param_offload={par}",
        f"actor_rollout_ref.actor.megatron.optimizer_offload={opt}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={w.micro_batch_tokens}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={w.gpu_memory_utilization}",
        f"trainer.nnodes={w.nodes}",
        f"trainer.n_gpus_per_node={w.devices_per_node}",
    ]
    return out
