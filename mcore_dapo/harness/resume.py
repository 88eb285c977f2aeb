"""verl's trainer killed during a step and started again with ``resume_mode=auto``, against an uninterrupted run.

``python -m mcore_dapo.harness.resume --workdir W [--baseline B]``

The runs are :func:`mcore_dapo.harness.tiny_dapo.run` with :data:`TRAINER_RUN`'s settings (the launch scripts'
``configs/dapo/common.sh``: checkpoints every 2 steps, ``resume_mode=auto``, the LR scheduler restored from the
checkpoint, with the audit): the baseline (4 steps, ``B``, the run ``tests/test_verl_trainer.py`` checks too),
a run whose every process gets SIGKILL once step 3's update has begun (the audit's ``step-0002`` folder
exists), and the same command again. The audit of each run (:mod:`mcore_dapo.verl_plugin.audit`) holds every
update's batch, weights before and after, loss, learning rate and gradient norm, and what the engine held
after each checkpoint save and load; :func:`compare` sets the resumed run's steps against the baseline's and
the state the resumed run loaded against what the killed run held when it saved.

The rollout is the plugin's ``hf_cpu``, whose generator restarts from the rollout's seed at each weight version
and which serves requests in arrival order (:class:`mcore_dapo.verl_plugin.rollout_cpu.CpuRolloutServer`): the
uninterrupted run's server has drawn for validation and steps 1 and 2 before step 3, the resumed run's for one
validation only (verl's ``val_before_train``). verl's own ``rollout.full_determinism`` does not serve here: its
agent loop names every request ``det-<priority>`` (verl/experimental/agent_loop/single_turn_agent_loop.py), and
the v1 trainer's agent loop starts a group's ``n`` sessions without a priority
(verl/trainer/ppo/v1/agent_loop_tq.py ``_run_prompt``), so all ``n`` responses of a group are drawn alike and
dynamic sampling filters every group out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

STEPS, KILL_STEP, SAVE_FREQ = 4, 3, 2


def trainer_run() -> dict:
    """The settings of the uninterrupted, the killed and the resumed run (:func:`tiny_dapo.run`'s arguments)."""
    from mcore_dapo import megatron_compat

    # R3 where Megatron has routing replay (0.16 on); the same run without replay options on the 0.12.1 line
    replay = "R3" if megatron_compat.supports_routing_replay() else None
    return {"steps": STEPS, "audit": True, "router_replay": replay}


def started(audit_dir: Path, step: int):
    """True once the audit began step ``step``'s update (it writes the weights before the update first)."""
    folder = audit_dir / f"step-{step - 1:04d}"
    return lambda: folder.is_dir()


def kill_and_resume(work: Path, timeout: float = 1200) -> dict:
    """The killed run (kept as ``*-killed``) and the resumed run, in ``work``; what each left."""
    from mcore_dapo.harness.tiny_dapo import read_metrics, run

    work = Path(work).absolute()
    killed = run(work, timeout=timeout, kill_when=started(work / "audit", KILL_STEP), **trainer_run())
    kept = {}
    for name in ("audit", "train.log", "metrics.jsonl"):
        src = work / name
        dst = work / (f"{name}-killed" if "." not in name else name.replace(".", "-killed."))
        if dst.exists():
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        if src.exists():
            src.rename(dst)
        kept[name] = dst
    ckpts = work / "checkpoints"
    after_kill = {"returncode": killed["returncode"], "steps_logged": len(read_metrics(kept["metrics.jsonl"])),
                  "tracker": _read(ckpts / "latest_checkpointed_iteration.txt"),
                  "step_folders": sorted(p.name for p in ckpts.glob("global_step_*")),
                  "seconds": killed["seconds"]}
    resumed = run(work, timeout=timeout, **trainer_run())
    return {"killed": after_kill, "killed_audit": str(kept["audit"]), "resumed": resumed,
            "resumed_audit": str(work / "audit"), "checkpoints": str(ckpts)}


def _read(p: Path) -> str | None:
    return p.read_text().strip() if p.is_file() else None


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from mcore_dapo.io.hf_reader import HFReader

    with HFReader(folder) as r:
        return {n: r.get(n) for n in r.keys()}


def weights_differ(a: Path, b: Path) -> list[str]:
    """HF tensor names whose bytes differ between two HF folders (or that one of them lacks)."""
    ta, tb = _tensors(a), _tensors(b)
    return sorted(n for n in ta.keys() | tb.keys()
                  if n not in ta or n not in tb or ta[n].dtype != tb[n].dtype or not torch.equal(ta[n], tb[n]))


def _ranks(folder: Path) -> list[dict]:
    return [torch.load(p, weights_only=False) for p in sorted(folder.glob("rank*.pt"))]


def _same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and \
            bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "dtype") and hasattr(a, "shape"):  # numpy arrays (numpy's RNG state)
        import numpy as np

        return bool(np.array_equal(a, b))
    return a == b


def step_vs_baseline(baseline: Path, resumed: Path, step: int, resumed_index: int) -> dict:
    """One update of the resumed run (its ``resumed_index``-th) against the baseline's update ``step``."""
    b, r = baseline / f"step-{step - 1:04d}", resumed / f"step-{resumed_index:04d}"
    rb, rr = _ranks(b), _ranks(r)
    out = {"step": step, "ranks": [len(rb), len(rr)],
           "batch_equal": len(rb) == len(rr) and all(_same(x["batch"], y["batch"]) for x, y in zip(rb, rr)),
           "lr": [rb[0]["lr"], rr[0]["lr"]], "loss": [rb[0]["loss"], rr[0]["loss"]],
           "grad_norm": [rb[0]["grad_norm"], rr[0]["grad_norm"]],
           "weights_before_differ": weights_differ(b / "hf", r / "hf"),
           "weights_after_differ": weights_differ(b / "hf-after", r / "hf-after")}
    # the prompts of the step (the dataloader's position), as the update saw them
    out["prompts_equal"] = len(rb) == len(rr) and all(
        _same(x["batch"]["input_ids"], y["batch"]["input_ids"]) for x, y in zip(rb, rr))
    return out


def restored_vs_held(killed: Path, resumed: Path, step: int) -> dict:
    """What the resumed run's engine held after loading checkpoint ``step``, piece by piece, against what the
    killed run's held when it saved it: per piece, the ranks where they differ."""
    saved, loaded = _ranks(killed / f"checkpoint-save-{step}"), _ranks(resumed / f"checkpoint-load-{step}")
    pieces = ("model", "optimizer", "lr_scheduler", "rng", "lr")
    out = {"ranks": [len(saved), len(loaded)],
           "differ": {k: [i for i, (s, l) in enumerate(zip(saved, loaded)) if not _same(s[k], l[k])] for k in pieces}}
    if saved:
        s = saved[0]
        out["optimizer_tensors"] = len(s["optimizer"])
        out["optimizer_state_keys"] = sorted(s["optimizer"][0].keys()) if s["optimizer"] else []
        out["main_param_dtypes"] = sorted({str(e["param"].dtype) for e in s["optimizer"]})
        out["model_tensors"] = len(s["model"])
        out["lr_scheduler"] = {k: s["lr_scheduler"].get(k) for k in ("num_steps", "max_lr", "warmup_steps")
                               if s["lr_scheduler"]} if s["lr_scheduler"] else None
        # the Adam moments are not all zero: the state saved is a trained one (steps 1 and 2)
        out["moments_nonzero"] = any(float(e["exp_avg"].abs().max()) > 0 for e in s["optimizer"] if "exp_avg" in e)
    return out


def compare(baseline_audit: Path, killed_audit: Path, resumed_audit: Path) -> dict:
    baseline_audit, killed_audit, resumed_audit = Path(baseline_audit), Path(killed_audit), Path(resumed_audit)
    resumed_steps = sorted(p.name for p in resumed_audit.glob("step-*"))
    return {"resumed_updates": len(resumed_steps),
            "steps": [step_vs_baseline(baseline_audit, resumed_audit, s, i)
                      for i, s in enumerate(range(KILL_STEP, STEPS + 1)) if i < len(resumed_steps)],
            "restored": restored_vs_held(killed_audit, resumed_audit, SAVE_FREQ)}


def main(argv=None) -> int:
    from mcore_dapo.harness.tiny_dapo import run

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.harness.resume")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--baseline", default=None, help="the uninterrupted run's workdir (run here when not given)")
    ap.add_argument("--timeout", type=float, default=1200)
    a = ap.parse_args(argv)
    work = Path(a.workdir).absolute()
    base = Path(a.baseline).absolute() if a.baseline else work / "baseline"
    if not (base / "audit").is_dir():
        r = run(base, timeout=a.timeout, **trainer_run())
        if r["returncode"] != 0:
            print(json.dumps({"baseline": r}))
            return 1
    out = kill_and_resume(work / "resume", a.timeout)
    out["resumed"].pop("audit", None)
    out["compare"] = compare(base / "audit", Path(out["killed_audit"]), Path(out["resumed_audit"]))
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
