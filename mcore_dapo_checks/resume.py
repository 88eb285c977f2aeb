"""verl's trainer killed during a step and started again with ``resume_mode=auto``, against an uninterrupted run.

``python -m mcore_dapo_checks.resume --workdir W [--baseline B]``

The runs are :func:`mcore_dapo_checks.tiny_dapo.run` with :func:`trainer_run`'s settings (the launch scripts'
``configs/dapo/common.sh``: checkpoints every 2 steps, ``resume_mode=auto``, the LR scheduler restored from the
checkpoint, with the audit): the baseline (4 steps, ``B``, the run ``tests/test_verl_trainer.py`` checks too),
a run whose every process gets SIGKILL once step 3's update has begun (the audit's ``step-0002`` folder
exists), and the same command again. The audit of each run (:mod:`mcore_dapo_checks.audit`) holds every
update's batch, weights before and after, loss, learning rate and gradient norm, and what the engine held
after each checkpoint save and load; :func:`compare` sets the resumed run's steps against the baseline's and
the state the resumed run loaded against what the killed run held when it saved.

The rollout is the plugin's ``hf_cpu``, whose generator restarts from the rollout's seed at each weight version
and which serves requests in arrival order (:class:`mcore_dapo.verl_cpu.rollout.CpuRolloutServer`): the
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
# the H100 script's layout class at tiny size on 4 ranks (TP2 with sequence parallelism, EP2, ETP1; data-parallel
# size 2 and expert data-parallel size 2: the distributed optimizer shards, the update reduces over DP)
LAYOUT = "h100-dp2"
# generation overlapped with training, the rollout on its own process, weights through the gloo checkpoint engine
TRAINER_MODE = "separate_async"


def trainer_run() -> dict:
    """The settings of the uninterrupted, the killed and the resumed run (:func:`tiny_dapo.run`'s arguments)."""
    from mcore_dapo import megatron_compat

    # R3 where Megatron has routing replay (0.16 on), with the old-log-prob pass skipped (ROLLOUT_CORRECTION=bypass:
    # the rollout's log-probs are the old policy, argued for where the routes are the rollout's); the same run
    # without replay options and with the scripts' default correction on the 0.12.1 line
    replay = "R3" if megatron_compat.supports_routing_replay() else None
    return {"steps": STEPS, "audit": True, "router_replay": replay, "layout": LAYOUT, "trainer_mode": TRAINER_MODE,
            "rollout_correction": "bypass" if replay else None}


def started(audit_dir: Path, step: int, tracker: Path | None = None):
    """True once the audit began step ``step``'s update (it writes the weights before the update first) and,
    with ``tracker``, that names step ``step - 1`` (a checkpoint saved in the background is complete only when the
    writes of every rank are, which may be later)."""
    folder = audit_dir / f"step-{step - 1:04d}"
    return lambda: folder.is_dir() and (tracker is None or _read(tracker) == str(step - 1))


def kill_and_resume(work: Path, timeout: float = 1200) -> dict:
    """The killed run (kept as ``*-killed``) and the resumed run, in ``work``; what each left."""
    from mcore_dapo_checks.tiny_dapo import read_metrics, run

    work = Path(work).absolute()
    # the launch scripts save in the background: killed once checkpoint 2 is complete, during step 3
    killed = run(work, timeout=timeout, kill_when=started(work / "audit", KILL_STEP,
                                                          work / "checkpoints" / "latest_checkpointed_iteration.txt"),
                 **trainer_run())
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


def four_steps(work: Path, timeout: float = 1200) -> dict:
    """:func:`kill_and_resume` in ``work`` seen as one run of :data:`STEPS` steps: the killed run's steps up to its
    checkpoint and the resumed run's after it. ``metrics`` (verl's per-step metrics, steps 1 to 4), ``audit`` (every
    update against the chained fp32 reference, :func:`chained_reference`), ``work`` (the checkpoints and the resumed
    run's ``train.log``), ``returncode`` and ``error`` (the resumed run's, or the killed run's where it did not
    reach its checkpoint), ``log_tail``, and ``pair`` (what kill_and_resume returned, with :func:`compare`'s
    ``compare``)."""
    from mcore_dapo_checks.tiny_dapo import log_tail, read_metrics

    work = Path(work).absolute()
    pair = kill_and_resume(work, timeout)
    killed, resumed = pair["killed"], pair["resumed"]
    log = work / "train.log"
    out = {"work": work, "pair": pair, "returncode": resumed["returncode"], "error": resumed["error"],
           "metrics": [], "audit": None}
    if killed["tracker"] != str(SAVE_FREQ):
        out.update(returncode=killed["returncode"], error=f"the killed run left tracker {killed['tracker']!r}, not "
                   f"{SAVE_FREQ}: no checkpoint to resume from (steps logged: {killed['steps_logged']})")
        log = work / "train-killed.log"
    out["log_tail"] = log_tail(log)
    if out["returncode"] != 0:
        return out
    pair["compare"] = compare(None, Path(pair["killed_audit"]), Path(pair["resumed_audit"]),
                              Path(pair["checkpoints"]))
    before = [r for r in read_metrics(work / "metrics-killed.jsonl") if r["data"]["training/global_step"] <= SAVE_FREQ]
    out["metrics"] = [r["data"] for r in [*before, *read_metrics(work / "metrics.jsonl")]]
    out["audit"] = pair["compare"].get("chained_reference")
    return out


EVICTED = "training/filter_groups/evicted_samples"  # groups dynamic sampling dropped in a step (absent: none)


def groups_drawn(metrics: list[dict], train_batch: int) -> int:
    """How many prompts the steps of ``metrics`` (verl's per-step metrics) took from the dataloader at least:
    the ``train_batch`` groups each step trained on and the groups dynamic sampling evicted (verl's v1 trainer
    fetches one prompt at a time under dynamic sampling, ``data.gen_batch_size=1``). The loader's count
    (``data.pt``'s ``_num_yielded``) at a step's checkpoint is this over the steps so far, plus the prompts
    fetched ahead; a loader restarted at a resume counts only the resumed run's share."""
    return sum(train_batch + int(m.get(EVICTED, 0)) for m in metrics)


def _prompts(step: Path) -> set[tuple[int, ...]]:
    """The prompts (token ids, each sequence less its response) an audited update trained on."""
    out = set()
    for f in sorted(step.glob("rank*.pt")):
        batch = torch.load(f, weights_only=False)["batch"]
        for ids, mask in zip(batch["input_ids"], batch["response_mask"]):
            out.add(tuple(int(t) for t in ids[:ids.shape[0] - mask.shape[0]]))
    return out


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


def _record(folder: Path) -> dict:
    r = _ranks(folder)
    return {"lr": r[0]["lr"], "loss": r[0]["loss"], "grad_norm": r[0]["grad_norm"]} if r else {}


def checkpointed_steps(killed: Path) -> list[Path]:
    """The killed run's audited updates up to its last checkpoint (step 3's update may have finished before the
    signal landed; it was never checkpointed)."""
    return [p for p in sorted(killed.glob("step-*"))[:SAVE_FREQ] if any(p.glob("rank*.pt"))]


def chained_reference(killed: Path, resumed: Path, out: Path) -> list[dict]:
    """The uninterrupted computation of the killed run's steps 1..2 and the resumed run's 3..4: every update
    recomputed on the HF model in fp32 with Megatron's optimizer step chained over all four
    (:func:`mcore_dapo_checks.audit_reference.reference`), so the resumed updates are held against an Adam whose
    moments and step went on through the kill."""
    from mcore_dapo_checks.audit_reference import reference

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    done = checkpointed_steps(killed)
    for i, src in enumerate([*done, *sorted(resumed.glob("step-*"))]):
        (out / f"step-{i:04d}").symlink_to(src.absolute(), target_is_directory=True)
    return reference(out)


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


def compare(baseline_audit: Path | None, killed_audit: Path, resumed_audit: Path, checkpoints: Path | None = None,
            baseline_checkpoints: Path | None = None) -> dict:
    """The resumed run against the killed one (and an uninterrupted run's audit where one is given)."""
    killed_audit, resumed_audit = Path(killed_audit), Path(resumed_audit)
    resumed_steps = sorted(p for p in resumed_audit.glob("step-*"))
    killed_steps = checkpointed_steps(killed_audit)
    out = {"resumed_updates": len(resumed_steps), "killed_updates": len(killed_steps),
           "restored": restored_vs_held(killed_audit, resumed_audit, SAVE_FREQ),
           "baseline": None if baseline_audit is None else
           [_record(Path(baseline_audit) / f"step-{s - 1:04d}") for s in range(1, STEPS + 1)],
           "killed": [_record(p) for p in killed_steps], "resumed": [_record(p) for p in resumed_steps]}
    if resumed_steps and killed_steps:
        # the resumed run's first update starts from the weights the killed run's last completed update left
        out["first_weights_vs_checkpointed"] = weights_differ(killed_steps[-1] / "hf-after", resumed_steps[0] / "hf")
        out["chained_reference"] = chained_reference(killed_audit, resumed_audit, resumed_audit.parent / "chained")
    if resumed_steps and killed_steps:
        # samples in flight at the kill (generated for step 3 or later by the killed run) are lost with it; the
        # resumed run's loader goes on after every prompt the killed run had drawn by its checkpoint, so no prompt
        # the killed run trained is trained again
        before, after = (set().union(*(_prompts(p) for p in steps)) for steps in (killed_steps, resumed_steps))
        out["prompts"] = {"killed": len(before), "resumed": len(after), "trained_twice": len(before & after)}
    if checkpoints is not None:
        def yielded(root: Path, step: int):
            p = Path(root) / f"global_step_{step}" / "data.pt"
            return torch.load(p, weights_only=False)["_num_yielded"] if p.is_file() else None

        out["dataloader_yielded"] = {"killed_step2": yielded(checkpoints, SAVE_FREQ),
                                     "resumed_step4": yielded(checkpoints, STEPS)}
        if baseline_checkpoints is not None:
            out["dataloader_yielded"].update(baseline_step2=yielded(baseline_checkpoints, SAVE_FREQ),
                                             baseline_step4=yielded(baseline_checkpoints, STEPS))
    return out


def main(argv=None) -> int:
    from mcore_dapo_checks.tiny_dapo import run

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.resume")
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
    out["compare"] = compare(base / "audit", Path(out["killed_audit"]), Path(out["resumed_audit"]),
                             Path(out["checkpoints"]), base / "checkpoints")
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
