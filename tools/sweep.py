"""Run a list of parallel layouts through a verl launch command, N steps each, and tabulate their metrics.

    mcore-dapo plan --model MODEL --nodes 4 --devices-per-node 8 --device h100 --top 5 --json > plan.json
    python tools/sweep.py --layouts plan.json --steps 5 --out sweep-out \\
        --command 'bash LAUNCH.sh {overrides} trainer.total_training_steps={steps}'

``LAUNCH.sh`` stands for a verl launch script that passes its arguments on to verl (``$@``).

``--layouts`` takes the JSON of ``mcore-dapo plan --json`` (its ``candidates``), or a JSON list of
objects with keys among tp, pp, ep, etp, cp, vpp, first, last (and optionally ``overrides``, a list
of Hydra overrides); ``-`` reads standard input. In the command, ``{overrides}`` becomes the
layout's verl overrides (the plan's, or those of the layout alone), and ``{tp} {pp} {ep} {etp} {cp}
{vpp} {first} {last} {steps} {name} {log}`` their values; other braces are left alone.

Each run's output goes to ``OUT/runs/NAME.log``; its metrics are read from there with
:mod:`mcore_dapo.metrics`. A failed run does not stop the sweep: an out-of-memory error is recorded
as ``oom``, another non-zero exit as ``failed``, a run past ``--timeout`` as ``timeout``, a run that
printed no metric line as ``no-metrics``. Results: ``OUT/results.csv``, ``results.md``,
``results.json`` and ``sweep.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from mcore_dapo.bridge import Layout
from mcore_dapo.cli import user_errors
from mcore_dapo.errors import UserError
from mcore_dapo.metrics import Batch, read_run, summarise
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.planner import layout_overrides

LAYOUT_KEYS = ("tp", "pp", "ep", "etp", "cp", "vpp", "first", "last")
PLACEHOLDER = re.compile(r"\{(tp|pp|ep|etp|cp|vpp|first|last|overrides|steps|name|log)\}")
# CUDA / torch, Ascend (ACL error, CANN code EL0004 "failed to allocate memory"), and generic spellings
OOM = re.compile(
    r"(?i:out of memory)|OutOfMemoryError|\bOOM\b|ACL_ERROR_RT_MEMORY_ALLOCATION|EL0004|RESOURCE_EXHAUSTED"
)
METRICS = ("e2e_tps", "update_tps", "vllm_tps", "timing_s/step", "timing_s/gen", "timing_s/update_actor",
           "perf/max_memory_allocated_gb")
COLUMNS = ("name", "layout", "status", "reason", "steps", *METRICS, "seconds", "log")


def load_layouts(path: str) -> list[dict]:
    """Layout objects from a plan's JSON or a JSON list; one-line errors for anything else."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise UserError(f"cannot read --layouts {path!r}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--layouts {path!r} is not JSON ({e.msg} at line {e.lineno}): accepted are the output of "
                        "'mcore-dapo plan --json' or a JSON list of layout objects") from None
    items = data.get("candidates") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items or not all(isinstance(d, dict) for d in items):
        raise UserError(f"--layouts {path!r} holds no layouts: accepted are the output of 'mcore-dapo plan --json' "
                        "or a non-empty JSON list of objects with keys among " + ", ".join(LAYOUT_KEYS))
    return items


def plan_layout(d: dict) -> PlanLayout:
    vals = {k: d.get(k) for k in LAYOUT_KEYS}
    for k, v in vals.items():
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UserError(f"{k}={v!r} in a layout is not accepted: a positive integer is")
    lay = Layout(tp=vals["tp"] or 1, pp=vals["pp"] or 1, ep=vals["ep"] or 1, etp=vals["etp"], cp=vals["cp"] or 1,
                 vpp=vals["vpp"])
    return PlanLayout(lay.validate(), vals["first"], vals["last"])


def name_of(pl: PlanLayout) -> str:
    return pl.describe().lower().replace(" ", "-")


def render_command(template: str, pl: PlanLayout, overrides: list[str], steps: int, log: Path) -> str:
    values = {**{k: ("" if v is None else str(v)) for k, v in pl.as_dict().items()},
              "overrides": " ".join(shlex.quote(o) for o in overrides), "steps": str(steps),
              "name": name_of(pl), "log": shlex.quote(str(log))}
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def classify(rc: int | None, log_text: str, has_metrics: bool) -> tuple[str, str]:
    """(status, reason) of a finished run; ``rc`` None means it was stopped at the timeout."""
    if rc is None:
        return "timeout", "stopped at the timeout"
    if rc != 0 or not has_metrics:
        m = OOM.search(log_text)
        if m:
            line = next((ln for ln in log_text.splitlines() if m.group(0) in ln), m.group(0))
            return "oom", line.strip()[:200]
        if rc != 0:
            last = next((ln for ln in reversed(log_text.splitlines()) if ln.strip()), "")
            return "failed", f"exit code {rc}: {last.strip()[:200]}"
        return "no-metrics", "exit code 0 but no 'step:N - ...' line"
    return "ok", ""


def run_one(cmd: str, log: Path, timeout: float) -> tuple[int | None, float]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        fh.write(f"# command: {cmd}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, shell=True, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the run's own process group, started above
            proc.wait()
            rc = None
    return rc, time.monotonic() - t0


def collect(log: Path, batch: Batch, warmup: int) -> dict:
    try:
        s = summarise(read_run(log), batch, warmup)
    except UserError:
        return {}
    return {"steps": s["steps"], **{k: s["median"].get(k) for k in METRICS}}


def sweep(items: list[dict], a) -> list[dict]:
    out = Path(a.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    layouts = [plan_layout(d) for d in items]  # every layout checked before the first run
    batch = Batch(world_size=a.world_size)
    rows = []
    for i, (d, pl) in enumerate(zip(items, layouts), 1):
        name, log = name_of(pl), out / "runs" / f"{name_of(pl)}.log"
        cmd = render_command(a.command, pl, d.get("overrides") or layout_overrides(pl), a.steps, log)
        print(f"[{i}/{len(items)}] {pl.describe()}: {cmd}", flush=True)
        if a.dry_run:
            continue
        rc, seconds = run_one(cmd, log, a.timeout)
        text = log.read_text(errors="replace").split("\n", 1)[-1]  # the run's output, without the command line
        metrics = collect(log, batch, a.warmup_steps)
        status, reason = classify(rc, text, bool(metrics))
        row = {"name": name, "layout": pl.describe(), **pl.as_dict(), "status": status, "reason": reason,
               "rc": rc, "seconds": round(seconds, 1), "log": str(log), "steps": 0, **metrics}
        rows.append(row)
        tps = f", e2e_tps {row['e2e_tps']:.1f}" if row.get("e2e_tps") else ""
        print(f"    -> {status}{tps} ({row['steps']} steps, {seconds:.1f} s){': ' + reason if reason else ''}",
              flush=True)
    return rows


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else "" if v is None else str(v)


def write_results(rows: list[dict], out: Path) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows({k: _fmt(r.get(k)) for k in COLUMNS} for r in rows)
    md = ["| " + " | ".join(COLUMNS[:-1]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
    md += ["| " + " | ".join(_fmt(r.get(k)).replace("|", "/") for k in COLUMNS[:-1]) + " |" for r in rows]
    (out / "results.md").write_text("\n".join(md) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    from mcore_dapo.metrics.plot import plot_sweep

    plot_sweep(rows, out / "sweep.png", title=f"layout sweep ({len(rows)} runs)")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python tools/sweep.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", required=True, help="plan JSON or a JSON list of layouts; '-' for stdin")
    ap.add_argument("--command", required=True, help="launch command template (see the module's help)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=None, help="run only the first N layouts")
    ap.add_argument("--out", default="sweep-out")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--world-size", type=int, default=None, help="for the throughputs (default: from the log)")
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    return ap.parse_args(argv)


@user_errors
def main(argv=None) -> int:
    a = parse_args(argv)
    if a.steps < 1 or (a.top is not None and a.top < 1):
        raise UserError(f"--steps {a.steps} / --top {a.top} is not accepted: positive integers are")
    items = load_layouts(a.layouts)[: a.top]
    rows = sweep(items, a)
    if a.dry_run:
        return 0
    write_results(rows, Path(a.out))
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} runs ok; results in {a.out}/results.csv, results.md, sweep.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
