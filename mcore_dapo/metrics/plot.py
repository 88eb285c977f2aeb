"""Per-step plots of runs: reward mean, response length, e2e throughput, and each run's timing breakdown
(matplotlib, Agg backend)."""

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


def plot_runs(runs: dict[str, dict[int, dict]], out: str | Path) -> Path:
    """``runs`` maps a run name to its per-step metrics (with throughputs); writes a PNG."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    timed = list(runs.items())[:MAX_TIMING_PANELS]
    lines = (("critic/rewards/mean", "critic/score/mean", "reward mean", "reward"),
             ("response_length/mean", None, "response length mean", "tokens"),
             ("e2e_tps", None, "end-to-end throughput (e2e_tps)", "tokens/s/device"))
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
