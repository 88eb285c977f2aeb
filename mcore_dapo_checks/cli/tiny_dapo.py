"""``mcore-dapo tiny-dapo``: verl's DAPO trainer on a tiny Qwen3-MoE on the CPU with the launch scripts'
settings (:mod:`mcore_dapo_checks.tiny_dapo`: the plugin's Megatron engine under EP2 or a script's layout
class, verl's own vLLM rollout on vLLM's CPU build or the plugin's ``hf_cpu`` stand-in). The one entry point:
``python -m mcore_dapo_checks.tiny_dapo ARGS`` is this command.

A stable command for the loop and for checks: ``--json`` prints one object with, per step, verl's
score, the engine's grad norm, the audit's HF grad norm, verl's rollout-vs-actor max |dp| and, with
``--router-replay``, the routing agreement between the rollout and training (hf_cpu rollout).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_commands(sub) -> None:
    from mcore_dapo_checks.tiny_dapo import ROLLOUTS

    p = sub.add_parser("tiny-dapo", help="verl's DAPO trainer for a few steps on a tiny Qwen3-MoE on the CPU")
    p.add_argument("--workdir", required=True, help="model, data, verl's logs and the audit go here; an earlier "
                   "run's checkpoints there are resumed (resume_mode=auto, as the launch scripts)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rollout", default="vllm", help=f"rollout engine: {' | '.join(ROLLOUTS)} (default vllm: verl's "
                   "own vLLM rollout on vLLM's CPU build; hf_cpu: the plugin's HF stand-in)")
    p.add_argument("--router-replay", default=None, help="off | R2 | R3 (verl's router_replay.mode; R3 needs "
                   "--rollout hf_cpu on the CPU)")
    p.add_argument("--rollout-dtype", default=None, help="bfloat16 | float32 (the rollout's dtype)")
    p.add_argument("--layout", default="ep2", help="ep2 | h100 | h100-dp2 | a2: EP2 alone, or a launch script's "
                   "layout at tiny size (h100: TP2 with sequence parallelism under EP; h100-dp2: the same on 4 ranks, "
                   "data-parallel and expert data-parallel size 2; a2: PP2 with VPP2 and uneven stages under EP, 4 "
                   "ranks)")
    p.add_argument("--gen-tp", type=int, default=1, help="the rollout's tensor-parallel size (the scripts' GEN_TP; "
                   "2 runs on vLLM's CPU build)")
    p.add_argument("--gen-ep", type=int, default=1, help="the rollout's expert-parallel size (the scripts' GEN_EP): 1, "
                   "or --gen-tp's (vLLM's experts over the replica's tensor-parallel ranks)")
    p.add_argument("--trainer-mode", default="sync", help="sync | colocate_async | separate_async (verl's "
                   "trainer.v1.trainer_mode: generation overlapped with training; separate_async runs the rollout "
                   "in its own process, weights through the gloo checkpoint engine)")
    p.add_argument("--rollout-correction", default=None, help="off | decoupled | bypass (the scripts' "
                   "ROLLOUT_CORRECTION; default theirs: decoupled in the asynchronous modes, else off; bypass takes the "
                   "rollout's log-probs as the old policy and skips the old-log-prob pass)")
    p.add_argument("--lr", type=float, default=1e-3, help="the actor's learning rate (default 1e-3)")
    p.add_argument("--teach-p", type=float, default=None,
                   help="the taught model's share of right answers (default 0.5: the answer form, not the rule)")
    p.add_argument("--no-audit", dest="audit", action="store_false",
                   help="skip the audit (every update recomputed on the HF model from the engine's weights)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is abandoned")
    p.add_argument("--json", action="store_true")
    p.add_argument("overrides", nargs="*", help="Hydra overrides after the scripts' (a variant of their settings, "
                   "e.g. actor_rollout_ref.actor.use_kl_loss=True)")
    p.set_defaults(fn=tiny_dapo)


def _validated(a) -> None:
    from mcore_dapo.errors import accepted
    from mcore_dapo_checks.tiny_dapo import ROLLOUTS

    if a.rollout not in ROLLOUTS:
        raise accepted("--rollout", a.rollout, " or ".join(ROLLOUTS))
    if a.steps < 1:
        raise accepted("--steps", a.steps, "at least 1")
    warmup = _warmup(a.overrides)
    if warmup is not None and a.steps <= warmup:  # Megatron's scheduler asserts it in every trainer worker
        raise accepted("--steps", a.steps, f"above the run's LR warm-up of {warmup} step(s) ({WARMUP_KEY}="
                       f"{warmup}: Megatron's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps), "
                       f"or {WARMUP_KEY}=0 as an override")
    if a.timeout <= 0:
        raise accepted("--timeout", a.timeout, "a positive number of seconds")
    if not a.lr > 0:
        raise accepted("--lr", a.lr, "a positive learning rate")
    if a.teach_p is not None and not 0 <= a.teach_p <= 1:
        raise accepted("--teach-p", a.teach_p, "a share between 0 and 1")
    bad = [o for o in a.overrides if "=" not in o and not o.startswith("~")]
    if bad:
        raise accepted("override", bad[0], "key=value, +key=value or ~key (Hydra)")
    from mcore_dapo_checks.tiny_dapo import LAYOUT_CLASSES

    if a.layout not in LAYOUT_CLASSES:
        raise accepted("--layout", a.layout, ", ".join(LAYOUT_CLASSES))
    if a.gen_tp not in (1, 2):
        raise accepted("--gen-tp", a.gen_tp, "1 or 2 (the tiny model's 4 KV heads over the rollout's ranks, "
                       "at most the trainer's 2 or 4 ranks)")
    if a.gen_ep not in (1, a.gen_tp):
        raise accepted("--gen-ep", a.gen_ep, f"1 or --gen-tp's {a.gen_tp} (vLLM's expert parallelism spans a "
                       "replica's tensor-parallel ranks)")
    from mcore_dapo_checks.tiny_dapo import check_trainer_mode, replay_overrides

    check_trainer_mode(a.trainer_mode)
    if a.rollout_correction not in (None, "off", "decoupled", "bypass"):
        raise accepted("--rollout-correction", a.rollout_correction, "off, decoupled or bypass")

    if a.rollout_dtype not in (None, "bfloat16", "float32"):
        raise accepted("--rollout-dtype", a.rollout_dtype, "bfloat16 or float32")
    replay_overrides(a.router_replay, a.rollout_dtype, a.rollout)  # its one-line refusals, before anything runs
    tracker = Path(a.workdir) / "checkpoints" / TRACKER
    done = resumed_from(a.workdir)
    if done is not None and done >= a.steps:
        from mcore_dapo.errors import UserError

        raise UserError(f"--workdir {a.workdir} holds a checkpoint of step {done}: the scripts resume from it "
                        f"(resume_mode=auto) and --steps {a.steps} leaves nothing to train; accepted: --steps above "
                        f"{done}, another --workdir, or {tracker.parent} removed")
    if a.rollout == "vllm":
        from mcore_dapo.resharding.vllm_target import require_vllm

        require_vllm()


WARMUP_KEY = "actor_rollout_ref.actor.optim.lr_warmup_steps"


def _warmup(overrides) -> int | None:
    """The run's warm-up in steps: an override's, else the CPU run's own; None where the overrides set it by
    ratio or decay steps (main_dapo's check of the composed config refuses those in one line before Ray)."""
    from mcore_dapo.launch_keys import value_of
    from mcore_dapo_checks.tiny_dapo import WARMUP

    optim = WARMUP_KEY.rpartition(".")[0]
    if any(value_of(overrides, f"{optim}.{k}") is not None for k in ("lr_warmup_steps_ratio", "lr_decay_steps")):
        return None
    value = value_of(overrides, WARMUP_KEY)
    try:
        return WARMUP if value is None else int(value)
    except ValueError:
        return None  # Hydra refuses it


TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker of the last complete checkpoint


def resumed_from(workdir) -> int | None:
    """The step of the checkpoint a run in ``workdir`` resumes from (resume_mode=auto), None without one."""
    tracker = Path(workdir) / "checkpoints" / TRACKER
    done = tracker.read_text().strip() if tracker.is_file() else ""
    return int(done) if done.isdigit() and int(done) > 0 else None


def report(r: dict, steps: int, start: int | None) -> tuple[dict, bool]:
    """(the run's summary, success): a run succeeds when its last global step reaches ``steps``, counting the
    steps of the checkpoint it resumed from (``start``), and, audited, every update passes the audit's checks (a
    resumed run's but its weights')."""
    from mcore_dapo_checks.tiny_dapo import per_step

    rows = per_step(r) if r["steps"] else []
    out = {"returncode": r["returncode"], "seconds": r["seconds"], "resumed_from": start, "steps": rows,
           "metrics_log": r["metrics_log"], "train_log": r["train_log"], "plot": r.get("plot")}
    # a resumed run's own audit chains the reference's Adam from its first update, not from the checkpoint's state:
    # its weights are not judged there (tests/test_resume.py chains the reference across the kill)
    passed = not any(m for row in rows for m in row.get("audit_misses") or ()
                     if start is None or not m.startswith("weights"))
    return out, r["returncode"] == 0 and bool(rows) and rows[-1]["step"] >= steps and passed


def tiny_dapo(a) -> int:
    from mcore_dapo_checks.tiny_dapo import run

    _validated(a)
    start = resumed_from(a.workdir)
    if start is not None and not a.json:
        print(f"resuming from step {start}: the checkpoint in {Path(a.workdir) / 'checkpoints'} "
              "(resume_mode=auto, as the launch scripts)", flush=True)
    r = run(Path(a.workdir).absolute(), a.steps, a.timeout, lr=a.lr, audit=a.audit, rollout=a.rollout,
            router_replay=a.router_replay, rollout_dtype=a.rollout_dtype, extra=tuple(a.overrides),
            teach_p=a.teach_p, layout=a.layout, gen_tp=a.gen_tp, gen_ep=a.gen_ep, trainer_mode=a.trainer_mode,
            rollout_correction=a.rollout_correction)
    summary, ok = report(r, a.steps, start)
    steps = summary["steps"]
    out = {"rollout": a.rollout, "trainer_mode": a.trainer_mode, "layout": a.layout, "gen_tp": a.gen_tp,
           "gen_ep": a.gen_ep, "router_replay": a.router_replay or "off", **summary}
    if r["returncode"] != 0 and Path(r["train_log"]).is_file():  # the first error, from the trainer's log
        from mcore_dapo.runtime.failures import summarize_entry_point_log

        why = summarize_entry_point_log(Path(r["train_log"]).read_text(errors="replace"))
        if why.user_error is not None:  # a user mistake, raised in the driver or a Ray actor: its line
            print(f"error: {why.user_error}", file=sys.stderr)
            return 2
        out["error"] = why.line
    if a.json:
        print(json.dumps(out))
    else:
        missed = [str(s["step"]) for s in steps if s.get("audit_misses")]
        failed = f"FAILED: {out['error']} (full log: {r['train_log']})" if "error" in out \
            else f"FAILED: the audit rejects step(s) {', '.join(missed)}" if missed \
            else f"FAILED, see {r['train_log']}"
        through = f", global steps {steps[0]['step']} to {steps[-1]['step']} of {a.steps}" if steps else ""
        print(f"verl's DAPO trainer, rollout {a.rollout}: {len(steps)} step(s){through} in {r['seconds']} s "
              f"({'ok' if ok else failed})")
        print(f"{'step':>4} {'score':>8} {'grad norm':>10} {'HF audit':>10} {'rollout vs actor':>17} {'route agr':>9} "
              f"{'stale':>5}  audit")
        for s in steps:
            ref = f"{s['reference_grad_norm']:.4f}" if s["reference_grad_norm"] is not None else "-"
            dp = f"{s['rollout_vs_actor']:.1e}" if s["rollout_vs_actor"] is not None else "-"
            agr = f"{s['routing_agreement']:.4f}" if s.get("routing_agreement") is not None else "-"
            stale = str(int(s["staleness"])) if s.get("staleness") is not None else "-"
            verdict = "-" if s.get("audit_misses") is None else ("ok" if not s["audit_misses"] else
                                                                 "MISS " + ", ".join(s["audit_misses"]))
            print(f"{s['step']:>4} {s['score']:>8.3f} {s['grad_norm']:>10.4f} {ref:>10} {dp:>17} {agr:>9} {stale:>5}  "
                  f"{verdict}")
    return 0 if ok else 1
