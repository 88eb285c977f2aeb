"""Per-step plots of runs: reward mean, validation accuracy (where verl validated), response length, e2e
throughput, for asynchronous runs the trajectory staleness and the share of the step spent waiting for (or hidden
from) generation, and each run's timing breakdown (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from mcore_dapo.errors import UserError

PARTS = (("timing_s/gen", "generation"), ("timing_s/old_log_prob", "old log-probs"),
         ("timing_s/update_actor", "update"))
MAX_TIMING_PANELS = 6


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'matplotlib==3.10.*'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _line(ax, runs: dict[str, dict[int, dict]], key: str, fallback: str | None = None):
    drawn = False
    for name, steps in runs.items():
        pts = [(s, m.get(key, m.get(fallback) if fallback else None)) for s, m in steps.items()]
        pts = [(s, v) for s, v in pts if v is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, label=name)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, f"no {key} in the logs", ha="center", va="center", transform=ax.transAxes)
    return drawn


def _timing(ax, name: str, steps: dict[int, dict]):
    xs = sorted(steps)
    bottom = [0.0] * len(xs)
    for key, label in PARTS:
        vals = [steps[s].get(key, 0.0) for s in xs]
        ax.bar(xs, vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    other = [max(0.0, steps[s].get("timing_s/step", b) - b) for s, b in zip(xs, bottom)]
    ax.bar(xs, other, bottom=bottom, label="other (reward, adv, sync...)", color="0.75")
    ax.set_title(f"timing per step: {name}", fontsize=10)
    ax.set_ylabel("seconds")


def validation_accuracy_key(runs: dict[str, dict[int, dict]]) -> str | None:
    """The first ``val-core/<data source>/acc/...`` metric of the runs (verl's validation accuracy), if any."""
    keys = sorted({k for steps in runs.values() for m in steps.values() for k in m
                   if k.startswith("val-core/") and "/acc/" in k})
    return keys[0] if keys else None


def plot_runs(runs: dict[str, dict[int, dict]], out: str | Path) -> Path:
    """``runs`` maps a run name to its per-step metrics (with throughputs); writes a PNG."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    timed = list(runs.items())[:MAX_TIMING_PANELS]
    lines = (("critic/rewards/mean", "critic/score/mean", "reward mean", "reward"),
             ("response_length/mean", None, "response length mean", "tokens"),
             ("e2e_tps", None, "end-to-end throughput (e2e_tps)", "tokens/s/device"))
    if any("rollout_corr/kl" in m for steps in runs.values() for m in steps.values()):
        # the rollout against the trainer's old policy (report.COLUMNS): an FP8 rollout or a broken sync shows here
        lines += (("rollout_corr/kl", None, "rollout vs trainer mismatch: KL(rollout || old policy) (verl)", "nats"),)
    if any("training/off_policy/trajectory_staleness/mean" in m for steps in runs.values() for m in steps.values()):
        # asynchronous modes (metrics/offpolicy.py): staleness, and generation the trainer waited for / hid
        lines += (("training/off_policy/trajectory_staleness/mean", None, "trajectory staleness mean (verl)",
                   "model versions"),
                  ("gen_wait_share", None, "share of the step waiting for generation (timing_s/gen / timing_s/step)",
                   "share"))
        if any("gen_hidden" in m for steps in runs.values() for m in steps.values()):
            lines += (("gen_hidden", None, "generation hidden vs the synchronous reference (per response token)",
                       "share"),)
    val = validation_accuracy_key(runs)
    if val is not None:  # verl's validation at test_freq: accuracy on the test file
        lines = lines[:1] + ((val, None, f"validation accuracy ({val})", "accuracy"),) + lines[1:]
    n = len(lines) + len(timed)
    fig, axes = plt.subplots(n, 1, figsize=(11, 2.5 * n), constrained_layout=True)
    for ax, (key, fallback, title, unit) in zip(axes, lines):
        _line(ax, runs, key, fallback)
        ax.set_title(f"{title} per step", fontsize=10)
        ax.set_ylabel(unit)
    for ax, (name, steps) in zip(axes[len(lines):], timed):
        _timing(ax, name, steps)
    all_steps = sorted({s for steps in runs.values() for s in steps})
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_xlim(all_steps[0] - 0.6, all_steps[-1] + 0.6)
        if len(all_steps) <= 20:
            ax.set_xticks(all_steps)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_sweep(rows: list[dict], out: str | Path, title: str = "layout sweep") -> Path:
    """Two bars per layout (median e2e_tps and update_tps); a run that did not finish is labelled with its
    status, and the steps it did before stopping are drawn faint."""
    plt = _pyplot()
    names = [r["name"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rows) + 3), 4.8), constrained_layout=True)
    xs = range(len(rows))
    width = 0.38
    e2e = [r.get("e2e_tps") or 0.0 for r in rows]
    upd = [r.get("update_tps") or 0.0 for r in rows]
    ok = [r["status"] == "ok" for r in rows]
    for shift, vals, label, color in ((-width / 2, e2e, "e2e_tps (median)", "tab:blue"),
                                      (width / 2, upd, "update_tps (median)", "tab:orange")):
        bars = ax.bar([x + shift for x in xs], vals, width, label=label, color=color)
        for bar, good in zip(bars, ok):
            if not good:  # steps done before the run failed: drawn faint
                bar.set_alpha(0.35)
                bar.set_hatch("//")
    top = max(e2e + upd + [1.0])
    for x, r, a, b in zip(xs, rows, e2e, upd):
        if r["status"] != "ok":
            color = "tab:red" if r["status"] in ("oom", "failed", "timeout") else "0.3"
            ax.text(x, max(a, b) + 0.02 * top, r["status"].upper(), ha="center", va="bottom", color=color,
                    fontsize=9, fontweight="bold")
    ax.set_ylim(0, top * 1.12)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens / s / device")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
