"""Parallelism planner: every legal TP/PP/EP/ETP/CP/VPP layout, its per-device memory and step time.

``devices`` (peak figures, with sources) -> ``layouts`` (enumeration, Megatron's layer placement) ->
``params`` (exact per-rank counts, checked against real Megatron by ``validate``) -> ``memory`` and
``timing`` (estimates) -> ``planner`` (ranking, verl overrides) -> ``report`` (table).
"""

from mcore_dapo.plan.hardware import DEVICES, DeviceSpec, get_device
from mcore_dapo.plan.layouts import PlanLayout, enumerate_layouts
from mcore_dapo.plan.params import RankParams, model_params, rank_params
from mcore_dapo.plan.planner import Candidate, evaluate, plan, verl_overrides
from mcore_dapo.plan.workload import Workload

__all__ = [
    "DEVICES", "DeviceSpec", "get_device", "PlanLayout", "enumerate_layouts", "RankParams", "model_params",
    "rank_params", "Candidate", "evaluate", "plan", "verl_overrides", "Workload",
]
