"""Per step of an asynchronous run (verl's v1 ``colocate_async`` / ``separate_async``): how stale the trained
trajectories were, and how much of the generation the trainer no longer waited for.

Staleness is verl's own (``trainer/ppo/v1/trainer_base.py``, ``_compute_metrics``), in model versions:
``training/off_policy/trajectory_staleness/*`` = current version - newest version a trajectory was generated
with; ``.../trajectory_staleness_worst/*`` = current - oldest; ``.../trajectory_spans/*`` = versions within one
trajectory (partial rollout). All are 0 (and spans 1) in a synchronous run.

Overlap. verl's trainer times its phases one after the other inside ``timing_s/step`` (``gen``: the wait for a
trainable batch, then ``reward``, ``old_log_prob``, ``adv``, ``update_actor``, ``update_weights``), so
``gen + update + other - step`` is never above zero, in any mode: generation that runs during the update
does not appear in the trainer's timers at all; it shows as a shorter ``timing_s/gen``. Hence:

* ``gen_wait_share = timing_s/gen / timing_s/step``: the share of the step the trainer waited for generation;
* ``gen_hidden = 1 - timing_per_token_ms/gen / R``, where ``R`` is the median ``timing_per_token_ms/gen`` (seconds
  waited per response token, verl's normalisation) of a synchronous reference run on the same cluster: the share
  of the synchronous generation time that this step no longer waited for (0 synchronous, 1 entirely hidden).
  Per token, so that the two runs' response lengths need not match. It counts both kinds of hiding: generation
  running beside training (``separate_async``) and the long tail no longer waited for (partial rollout, both
  async modes).
"""

from __future__ import annotations

import statistics

from mcore_dapo.errors import UserError
from mcore_dapo.metrics.parse import RunLog

STALENESS = "training/off_policy/trajectory_staleness/mean"
STALENESS_MAX = "training/off_policy/trajectory_staleness/max"
STALENESS_WORST = "training/off_policy/trajectory_staleness_worst/max"
SPANS = "training/off_policy/trajectory_spans/max"
GEN_PER_TOKEN = "timing_per_token_ms/gen"
OFF_POLICY_KEYS = (STALENESS, STALENESS_MAX, STALENESS_WORST, SPANS)


def step_overlap(m: dict[str, float], reference_ms: float | None = None) -> dict[str, float]:
    """``gen_wait_share`` and, given a synchronous reference's ms per response token, ``gen_hidden``."""
    out = {}
    gen, step = m.get("timing_s/gen"), m.get("timing_s/step")
    if gen is not None and step:
        out["gen_wait_share"] = gen / step
    per_token = m.get(GEN_PER_TOKEN)
    if reference_ms and per_token is not None:
        out["gen_hidden"] = 1.0 - per_token / reference_ms
    return out


def is_asynchronous(run: RunLog) -> bool:
    return any(m.get(STALENESS_WORST, 0) > 0 or m.get(SPANS, 1) > 1 for m in run.steps.values())


def reference_ms_per_token(run: RunLog, warmup_steps: int = 1) -> float:
    """Median ``timing_per_token_ms/gen`` of a synchronous run (steps after ``warmup_steps`` where there are)."""
    if is_asynchronous(run):
        raise UserError(f"--sync-reference {run.source!r} is an asynchronous run (its trajectories are stale): "
                        "accepted is the log of a synchronous run (trainer.v1.trainer_mode=sync)")
    vals = {s: m[GEN_PER_TOKEN] for s, m in run.steps.items() if GEN_PER_TOKEN in m}
    if not vals:
        raise UserError(f"--sync-reference {run.source!r} has no {GEN_PER_TOKEN}: accepted is a verl console log "
                        "(verl logs it with every step's timings)")
    used = [v for s, v in vals.items() if s > warmup_steps] or list(vals.values())
    return statistics.median(used)
