"""Step time of verl's v1 trainer modes (``sync``, ``colocate_async``, ``separate_async``), projected from the
phase times of one measured synchronous step. A model, stated here and in docs/PLANNER.md; only the phase
times are measured.

From the measured step (``N_ref`` devices): ``G`` generation (``timing_s/gen``), of which ``D`` is decoding
(``timing_s/generate_sequences`` where logged, else all of ``G``; the rest, ``G - D``, is waking the rollout and
loading its weights), ``L`` old log-probs, ``U`` the update, ``O`` everything else in ``timing_s/step`` (reward,
advantages, untimed work; ``W`` of it the colocated rollout's weight update where timed apart,
``timing_s/update_weights``), and ``tail = response_length/mean / response_length/max``. On ``N`` devices the
training phases scale by ``s = N_ref / N``; ``O`` and ``G - D`` are kept. Decoding is the log's, scaled by the
devices: ``M(X) = D N_ref / X``. The generation model (:mod:`mcore_dapo.plan.generation`) ranks rollout layouts but
is not used here: for the guide's own configuration it projects 2.8 times the logged decoding (docs/PLANNER.md).

* ``sync``: ``(G - D) + M(N) + (L + U) s + O``.
* ``colocate_async``: generation and training still take turns on the same devices (verl puts the rollout to
  sleep for the update, ``trainer_colocate_async.py``), so nothing runs at the same time. What it gains is the
  long tail: a synchronous batch decodes until its longest response ends, with the engine emptying as the
  shorter ones finish; with one batch generated ahead and unfinished responses carried over (partial rollout),
  the engine stays full, so decoding costs the batch's mean length instead of its longest:
  ``(G - D) + M(N) tail + (L + U) s + O``. Decoding time per step is taken as independent of how many sequences
  are in flight, which makes this an upper bound on the gain.
* ``separate_async``: ``T`` training and ``R = N - T`` rollout devices work at the same time (verl 0.9.1,
  ``hybrid_engine=False``); the slower side sets the pace, then the weights travel:
  ``max(M(R) tail, (L + U) s t(T) / t(N) + O - W) + sync``, where ``t(X)`` is the planner's step time of
  the best layout that fits on ``X`` devices (no rollout memory on the training devices) and divides the
  batch, and ``sync`` is the checkpoint engine's published time for this model (:data:`SYNC_S`). Every whole
  number of training nodes is tried; the fastest split is kept.

verl's own numbers beside them (``docs/advance/v1_async_trainer.md``, Qwen3.5-35B-A3B on Megatron, mean
response 12,720 of 32,768 tokens, 4 nodes): +56.4 % tokens/s for colocate_async, +56.2 % for separate_async.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.errors import UserError
from mcore_dapo.launch_keys import TRAINER_MODES
from mcore_dapo.plan.workload import Workload

MODES = tuple(TRAINER_MODES)  # verl 0.9.1's v1 trainer modes
# tokens/s against sync, verl-project/verl docs/advance/v1_async_trainer.md ("V1 trainer all modes")
VERL_PUBLISHED = {"sync": 0.0, "colocate_async": 0.564, "separate_async": 0.562}
VERL_SOURCE = ("verl docs/advance/v1_async_trainer.md: Qwen3.5-35B-A3B, Megatron TP2 PP2 CP2 EP4, 4 nodes, "
               "max response 32768 (mean 12,720), train batch 64, mini-batch 16, parameter_sync_step 4")
# one weight sync of Qwen3-30B-A3B to the rollout pool, published (verl/checkpoint_engine/README.md):
# nccl on 4 x 8 H100 (InfiniBand) ~7 s; hccl on 2 x 16 Ascend 910C ~11 s (no A2 figure is published)
SYNC_S = {"h100": 7.0, "h200": 7.0, "a100": 7.0, "a2": 11.0}

TIMING = ("timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/step")


@dataclass(frozen=True)
class Phases:
    """One synchronous step's phase times (seconds), its tokens and devices, and its response lengths."""

    gen_s: float
    decode_s: float
    old_log_prob_s: float
    update_s: float
    step_s: float
    tokens: float  # perf/total_num_tokens: prompt + response tokens of the step's batch
    devices: int
    mean_response: float
    max_response: float
    source: str
    weights_s: float = 0.0  # timing_s/update_weights (v1: the colocated rollout's weight update, timed apart)
    prompt_mean: float = 0.0  # prompt_length/mean
    clip_ratio: float = 0.0  # response_length/clip_ratio: the share of responses cut at the longest

    @property
    def other_s(self) -> float:
        return max(0.0, self.step_s - self.gen_s - self.old_log_prob_s - self.update_s)

    @property
    def tail(self) -> float:
        """Mean over longest response: the share of a synchronous decode the engine is kept full."""
        return self.mean_response / self.max_response

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(other_s=round(self.other_s, 3), tail=round(self.tail, 4))
        return d


# The guide's logged step (step 9 of its DAPO run on 32 Ascend A2 NPUs with FSDP; tests/test_plan.py reads the
# same numbers from the log itself).
GUIDE = Phases(gen_s=161.7286260649562, decode_s=142.09425354003906, old_log_prob_s=16.38148122187704,
               update_s=130.07783674728125, step_s=310.60584014933556, tokens=2503440.0, devices=32,
               mean_response=4725.28125, max_response=6144.0, prompt_mean=164.25, clip_ratio=0.310546875,
               source="the guide's step 9 (32 x Ascend A2, FSDP, verl's synchronous trainer)")


def phases_from_log(path: str | Path) -> Phases:
    """Median phase times of a synchronous run's verl console log (steps after the first where there are
    several); the device count from verl's ``perf/throughput``."""
    from mcore_dapo.metrics import read_run
    from mcore_dapo.metrics.throughput import world_from_log

    run = read_run(path)
    steps = [m for s, m in sorted(run.steps.items()) if all(k in m for k in TIMING)]
    if not steps:
        raise UserError(f"--phases {str(path)!r} has no step with {', '.join(TIMING)}: accepted is the console log "
                        "of a synchronous verl run")
    if len(steps) > 1:
        steps = steps[1:]  # the first step warms up
    stale = [m["training/off_policy/trajectory_staleness/max"] for m in steps
             if m.get("training/off_policy/trajectory_staleness/max", 0) > 0]
    if stale:
        raise UserError(f"--phases {str(path)!r} is an asynchronous run (trajectory staleness up to {max(stale):g}): "
                        "accepted is the log of a synchronous run (trainer.v1.trainer_mode=sync)")

    def med(key, default=None):
        vals = [m[key] for m in steps if key in m]
        return statistics.median(vals) if vals else default

    devices = world_from_log(steps[-1])
    resp_mean, resp_max = med("response_length/mean"), med("response_length/max")
    if not devices or not med("perf/total_num_tokens") or not resp_mean or not resp_max:
        raise UserError(f"--phases {str(path)!r} lacks perf/throughput, perf/total_num_tokens or response_length/"
                        "mean and max: accepted is a verl console log with verl's throughput and data metrics")
    gen = med("timing_s/gen")
    return Phases(gen_s=gen, decode_s=min(gen, med("timing_s/generate_sequences", gen)),
                  old_log_prob_s=med("timing_s/old_log_prob"), update_s=med("timing_s/update_actor"),
                  step_s=med("timing_s/step"), tokens=med("perf/total_num_tokens"), devices=devices,
                  mean_response=resp_mean, max_response=resp_max, weights_s=med("timing_s/update_weights", 0.0),
                  prompt_mean=med("prompt_length/mean", 0.0), clip_ratio=med("response_length/clip_ratio", 0.0),
                  source=f"{path}: median of {len(steps)} step(s)")


@dataclass(frozen=True)
class ModeProjection:
    mode: str
    step_s: float
    tokens_per_s_per_device: float
    speedup: float  # tokens/s over sync's, minus 1
    verl_published: float
    detail: dict

    def as_dict(self) -> dict:
        return {"mode": self.mode, "step_s": round(self.step_s, 2),
                "tokens_per_s_per_device": round(self.tokens_per_s_per_device, 2), "speedup": round(self.speedup, 4),
                "verl_published_speedup": self.verl_published, **self.detail}


def best_time(cfg: HFModelConfig, w: Workload) -> tuple[float, str] | None:
    """(step time, layout) of the fastest layout that fits ``w`` and divides its batch over data parallelism."""
    from mcore_dapo.plan.planner import plan

    samples = w.prompts * w.responses_per_prompt
    for c in plan(cfg, w):
        if c.fits and samples % c.layout.layout.dp(w.world_size) == 0:
            return c.time.total_s, c.layout.describe()
    return None


def separate_split(cfg: HFModelConfig, w: Workload, p: Phases, t_all: float) -> dict | None:
    """The fastest whole-node split of ``w``'s devices into training and rollout (None when no training layout
    fits on fewer nodes than all)."""
    s = p.devices / w.world_size
    sync = SYNC_S.get(w.device.name, 0.0)
    best = None
    for k in range(1, w.nodes):
        trainer = replace(w, nodes=k, gpu_memory_utilization=0.0)  # no rollout engine on the training devices
        got = best_time(cfg, trainer)
        if got is None:
            continue
        t_k, layout = got
        rollout_devices = (w.nodes - k) * w.devices_per_node
        gen = p.decode_s * p.devices / rollout_devices * p.tail
        # no rollout on the training devices: the colocated weight update is replaced by the transport's sync
        train = (p.old_log_prob_s + p.update_s) * s * t_k / t_all + p.other_s - p.weights_s
        step = max(gen, train) + sync
        if best is None or step < best["step_s"]:
            best = {"step_s": step, "trainer_nodes": k, "rollout_nodes": w.nodes - k,
                    "rollout_devices": rollout_devices, "trainer_layout": layout, "gen_s": round(gen, 2),
                    "train_s": round(train, 2), "sync_s": sync, "old_log_prob_s": round(p.old_log_prob_s * s * t_k / t_all, 2)}
    return best


def project(cfg: HFModelConfig, w: Workload, p: Phases, t_all: float) -> list[ModeProjection]:
    """The three modes on ``w``'s cluster, from the measured phases ``p``; ``t_all``: the planner's step time of
    the best fitting layout on all devices. Fastest first."""
    s = p.devices / w.world_size
    wake = p.gen_s - p.decode_s
    train = (p.old_log_prob_s + p.update_s) * s + p.other_s
    decode = p.decode_s * s
    extra = {"decode_s": round(decode, 2), "old_log_prob_s": round(p.old_log_prob_s * s, 2)}
    steps = {
        "sync": (wake + decode + train, {"gen_s": round(wake + decode, 2), "train_s": round(train, 2), **extra,
                                         "decoding_s": round(decode, 2)}),
        "colocate_async": (wake + decode * p.tail + train,
                           {"gen_s": round(wake + decode * p.tail, 2), "train_s": round(train, 2), **extra,
                            "decoding_s": round(decode * p.tail, 2)}),
    }
    split = separate_split(cfg, w, p, t_all)
    if split is not None:
        steps["separate_async"] = (split.pop("step_s"), split)
    sync_tps = p.tokens / (steps["sync"][0] * w.world_size)
    out = []
    for mode, (step, detail) in steps.items():
        tps = p.tokens / (step * w.world_size)
        out.append(ModeProjection(mode, step, tps, tps / sync_tps - 1, VERL_PUBLISHED[mode], detail))
    return sorted(out, key=lambda m: m.step_s)


# verl docs/low_precision/fp8.md: Qwen3-30B-A3B-Base DAPO on 2 x 8 H100, blockwise FP8 rollout "more than 35 %"
# faster than bf16 (published, not measured here; A2 has no FP8)
FP8_ROLLOUT_SPEEDUP = 1.35
FP8_SOURCE = "verl docs/low_precision/fp8.md (Qwen3-30B-A3B-Base DAPO, 2 x 8 H100): rollout > 35 % faster, published"


def cheaper(m: ModeProjection, fp8: bool) -> dict:
    """One mode's step with the old-log-prob pass skipped (ROLLOUT_CORRECTION=bypass: the pass's time from the
    phases) and, where the device has FP8 (``fp8``), with verl's FP8 rollout as well (its generation shortened by
    the published speed-up, FP8_ROLLOUT_SPEEDUP)."""
    d = m.detail
    gen, train, olp = d["gen_s"], d["train_s"], d["old_log_prob_s"]

    def step(gen_s: float, train_s: float) -> float:
        if m.mode == "separate_async":
            return max(gen_s, train_s) + d["sync_s"]
        return gen_s + train_s

    out = {"bypass_s": round(step(gen, train - olp), 2)}
    if fp8:
        # the decoding part of the generation shortens (the separate rollout pool's generation is all decoding)
        decoding = d.get("decoding_s", gen)
        gen8 = gen - decoding + decoding / FP8_ROLLOUT_SPEEDUP
        out["fp8_s"] = round(step(gen8, train), 2)
        out["fp8_bypass_s"] = None  # FP8 needs decoupled correction (token-level IS): bypass is refused with it
    return out


def render(projections: list[ModeProjection], p: Phases, fp8: bool = False) -> list[str]:
    """The modes' table; ``fp8``: the device has FP8 (verl's FP8 rollout projected beside the bypass)."""
    modelled = "; decoding the log's, scaled by the devices"
    lines = [f"trainer modes (a model from measured phases: {p.source}; gen {p.gen_s:.1f} s of which decoding "
             f"{p.decode_s:.1f} s, old log-probs {p.old_log_prob_s:.1f} s, update {p.update_s:.1f} s, other "
             f"{p.other_s:.1f} s, step {p.step_s:.1f} s on {p.devices} devices; mean/longest response {p.tail:.2f}"
             f"{modelled}):",
             f"  {'mode':16s} {'step s':>8s} {'tok/s/dev':>10s} {'vs sync':>8s} {'verl published':>15s}  detail"]
    for m in projections:
        d = m.detail
        if m.mode == "separate_async":
            detail = (f"{d['trainer_nodes']} training + {d['rollout_nodes']} rollout nodes, training layout "
                      f"{d['trainer_layout']}; gen {d['gen_s']:.1f} s | train {d['train_s']:.1f} s, + sync {d['sync_s']:g} s")
        else:
            detail = f"gen {d['gen_s']:.1f} s + train {d['train_s']:.1f} s"
        lines.append(f"  {m.mode:16s} {m.step_s:8.1f} {m.tokens_per_s_per_device:10.1f} {m.speedup:+8.1%} "
                     f"{m.verl_published:+15.1%}  {detail}")
    if not any(m.mode == "separate_async" for m in projections):
        lines.append("  separate_async: no training layout fits on fewer nodes than all")
    lines.append(f"  best: {projections[0].mode}; verl published: {VERL_SOURCE}")
    lines.append("  cheaper rollouts (ROLLOUT_CORRECTION=bypass: the old-log-prob pass skipped"
                 + ("; ROLLOUT_DTYPE=fp8: generation / 1.35, " + FP8_SOURCE if fp8 else "; no FP8 on this device")
                 + "):")
    for m in projections:
        c = cheaper(m, fp8)
        row = f"    {m.mode:16s} step {m.step_s:7.1f} s -> bypass {c['bypass_s']:7.1f} s"
        if fp8:
            row += f", fp8 {c['fp8_s']:7.1f} s"
        lines.append(row)
    return lines
