"""The guide's throughputs per step, and their summary over a run.

Per device and second (guide, section 3.3)::

    tokens   = (response_length/mean + prompt_length/mean) x prompts x responses per prompt / world size
    e2e_tps    = tokens / timing_s/step
    update_tps = tokens / timing_s/update_actor
    vllm_tps   = tokens / timing_s/gen

Without the batch sizes, verl's ``perf/total_num_tokens`` (the same numerator times the world
size) is used; the world size comes from ``--world-size`` or, failing that, from the logged
``perf/throughput = perf/total_num_tokens / world / perf/time_per_step``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mcore_dapo.errors import UserError
from mcore_dapo.metrics.parse import RunLog

TPS = {"e2e_tps": "timing_s/step", "update_tps": "timing_s/update_actor", "vllm_tps": "timing_s/gen"}
SUMMARY_KEYS = (
    "e2e_tps", "update_tps", "vllm_tps", "timing_s/step", "timing_s/gen", "timing_s/old_log_prob",
    "timing_s/update_actor", "critic/rewards/mean", "critic/score/mean", "response_length/mean",
    "prompt_length/mean", "perf/max_memory_allocated_gb", "perf/throughput",
    "actor/routing/rollout_agreement", "actor/routing/replay_agreement",
    # asynchronous modes (metrics/offpolicy.py)
    "gen_wait_share", "gen_hidden", "training/off_policy/trajectory_staleness/mean",
    "training/off_policy/trajectory_staleness_worst/max",
)


@dataclass(frozen=True)
class Batch:
    """What the guide's formula needs beyond the log; any may be None."""

    world_size: int | None = None
    prompts: int | None = None  # data.train_batch_size
    responses_per_prompt: int | None = None  # actor_rollout_ref.rollout.n

    def __post_init__(self):
        for name in ("world_size", "prompts", "responses_per_prompt"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UserError(f"{name}={v!r} is not accepted: a positive integer is")


def world_from_log(m: dict[str, float]) -> int | None:
    """verl's perf/throughput = perf/total_num_tokens / world / time per step, solved for the world size."""
    tput, total = m.get("perf/throughput"), m.get("perf/total_num_tokens")
    t = m.get("perf/time_per_step", m.get("timing_s/step"))
    if not (tput and total and t):
        return None
    w = total / (tput * t)
    return round(w) if abs(w - round(w)) < 0.01 * w and round(w) >= 1 else None


def tokens_per_device(m: dict[str, float], batch: Batch) -> tuple[float | None, str]:
    """(numerator, how it was obtained) for one step's metrics."""
    world = batch.world_size or world_from_log(m)
    resp, prompt = m.get("response_length/mean"), m.get("prompt_length/mean")
    if batch.prompts and batch.responses_per_prompt and resp is not None and prompt is not None:
        if not world:
            return None, "no world size (pass --world-size)"
        return (resp + prompt) * batch.prompts * batch.responses_per_prompt / world, "guide formula"
    total = m.get("perf/total_num_tokens")
    if total is not None and world:
        return total / world, "perf/total_num_tokens / world size"
    return None, "needs --prompts/--responses-per-prompt/--world-size, or perf/total_num_tokens and a world size"


def step_throughputs(m: dict[str, float], batch: Batch) -> dict[str, float]:
    tokens, _ = tokens_per_device(m, batch)
    out = {}
    if tokens is None:
        return out
    for name, key in TPS.items():
        if m.get(key):
            out[name] = tokens / m[key]
    return out


def with_throughputs(run: RunLog, batch: Batch, reference_ms: float | None = None) -> dict[int, dict[str, float]]:
    """Every step's metrics plus e2e_tps, update_tps and vllm_tps where they can be computed, and the share of the
    step spent waiting for generation (``gen_wait_share``; ``gen_hidden`` given a synchronous run's ms per response
    token, metrics/offpolicy.py)."""
    from mcore_dapo.metrics.offpolicy import step_overlap

    return {s: {**m, **step_throughputs(m, batch), **step_overlap(m, reference_ms)}
            for s, m in sorted(run.steps.items())}


def summarise(run: RunLog, batch: Batch = Batch(), warmup_steps: int = 1, reference_ms: float | None = None) -> dict:
    """Median of each key over the steps numbered above ``warmup_steps`` (all steps if none are)."""
    if warmup_steps < 0:
        raise UserError(f"warmup_steps={warmup_steps} is not accepted: a count of steps >= 0 is")
    steps = with_throughputs(run, batch, reference_ms)
    used = [s for s in steps if s > warmup_steps]
    fallback = not used
    if fallback:
        used = list(steps)
    med = {}
    for key in SUMMARY_KEYS:
        vals = [steps[s][key] for s in used if key in steps[s]]
        if vals:
            med[key] = statistics.median(vals)
    _, how = tokens_per_device(steps[used[-1]], batch)
    return {
        "source": run.source,
        "files": run.files,
        "steps": len(steps),
        "first_step": min(steps),
        "last_step": max(steps),
        "steps_summarised": used,
        "warmup_steps": warmup_steps,
        "warmup_fallback": fallback,
        "malformed_lines": run.malformed,
        "duplicate_steps": run.duplicates,
        "tokens_from": how,
        "median": med,
    }
