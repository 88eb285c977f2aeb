"""Text rendering of a run's steps and summary."""

from __future__ import annotations

COLUMNS = (
    ("step", None, "d"), ("step s", "timing_s/step", ".1f"), ("gen s", "timing_s/gen", ".1f"),
    ("logp s", "timing_s/old_log_prob", ".1f"), ("update s", "timing_s/update_actor", ".1f"),
    ("e2e_tps", "e2e_tps", ".2f"), ("update_tps", "update_tps", ".2f"), ("vllm_tps", "vllm_tps", ".2f"),
    ("reward", "critic/rewards/mean", ".3f"), ("resp len", "response_length/mean", ".0f"),
    ("route agr", "actor/routing/rollout_agreement", ".4f"),  # rollout vs training top-k sets (MoE)
    ("replay agr", "actor/routing/replay_agreement", ".4f"),  # the update's against the routes it replays (R2, R3)
    # the rollout against the trainer's old policy (verl's rollout correction, decoupled mode: rollout_corr_helper.py):
    # KL(rollout || old) and |log PPL(old) - log PPL(rollout)| over the batch; what an FP8 rollout or a broken sync
    # moves first (bypass mode skips the pass that computes them)
    ("mismatch kl", "rollout_corr/kl", ".2e"), ("ppl diff", "rollout_corr/log_ppl_abs_diff", ".4f"),
    # asynchronous modes (metrics/offpolicy.py): verl's staleness in model versions, the step's share spent
    # waiting for generation, and the share of a synchronous run's generation time no longer waited for
    ("stale", "training/off_policy/trajectory_staleness/mean", ".2f"),
    ("stale wmax", "training/off_policy/trajectory_staleness_worst/max", ".0f"),
    ("gen wait", "gen_wait_share", ".2f"), ("gen hidden", "gen_hidden", ".2f"),
)


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_steps(steps: dict[int, dict]) -> str:
    head = "  ".join(f"{c:>10s}" for c, _, _ in COLUMNS)
    rows = [head]
    for s, m in steps.items():
        rows.append("  ".join(f"{_cell(s if k is None else m.get(k), f):>10s}" for _, k, f in COLUMNS))
    return "\n".join(rows)


def render_summary(summary: dict) -> str:
    used = summary["steps_summarised"]
    lines = [
        f"{summary['source']}: {summary['steps']} steps ({summary['first_step']}..{summary['last_step']}) from "
        f"{len(summary['files'])} file(s); {summary['malformed_lines']} malformed lines skipped, "
        f"{summary['duplicate_steps']} repeated steps",
        f"median over {len(used)} step(s) "
        + ("(every step: all are warm-up)" if summary["warmup_fallback"]
           else f"(steps <= {summary['warmup_steps']} are warm-up)")
        + f"; tokens from {summary['tokens_from']}",
    ]
    for key, v in summary["median"].items():
        lines.append(f"  {key:32s} {v:12.4f}")
    return "\n".join(lines)
