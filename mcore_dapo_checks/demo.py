"""``mcore-dapo demo``: the main job on an embedded tiny Qwen3-MoE, on CPU processes.

1. generate a tiny Qwen3-MoE with transformers (seeded, safetensors, hub layout);
2. compute its logits, and its loss and gradients, with HF transformers in a clean process (the reference);
3. build it with the bridge as a sharded Megatron model (2 processes, gloo, EP2 with
   both dispatchers, and TP2 with sequence parallelism), load the HF weights, compare
   logits, run a training forward+backward through Megatron's schedules and DDP and compare the
   loss and every parameter's gradient (brought to HF names by the weight exporter) with HF's;
4. convert it to a Megatron torch_dist checkpoint under EP2, load that under TP2 and compare
   with HF (``mcore-convert verify``), convert it back to HF and check every tensor's bytes;
5. rollout sync: export the EP2 model in buckets into an HF model (bit-exact, logits equal),
   take an optimizer step on the Megatron side, sync again, compare logits with Megatron's;
6. one DAPO policy update with verl's own functions (dapo reward manager, GRPO advantages,
   clipped policy loss) on the EP2 Megatron model, against a one-process HF reference
   (when verl is installed);
7. the same update through verl's own Megatron engine path: verl's ``ActorRolloutRefWorker``
   builds this plugin's ``McoreDapoEngine`` (its subclass for verl's cpu device; bf16, as verl runs it),
   ``compute_log_prob`` and
   ``update_actor`` with verl's ``ppo_loss``, then the engine's weights go to the rollout model;
8. verl's DAPO trainer itself for four steps with the launch scripts' settings
   (``mcore_dapo_checks.tiny_dapo``: configs/dapo/common.sh with only sizes, counts and the rollout's
   CPU settings changed): Ray, the agent loop on verl's own vLLM rollout (vLLM's CPU build; the
   plugin's ``hf_cpu`` stand-in where vLLM is not installed), dynamic batch sizes, the distributed
   optimizer, warm-up, full recompute, offload, validation and checkpoints every 2 steps, verl's
   math_dapo reward, dynamic sampling, the Megatron actor (EP2), weight sync each step; verl's
   metrics log and a PNG of the run; every update recomputed on the HF model (the audit).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mcore_dapo.bridge.layout import Layout
from mcore_dapo.runtime.launch import torchrun

TOLERANCE = 1e-4  # max |logit difference| in float32


@dataclass(frozen=True)
class DemoLayout:
    nproc: int
    args: tuple[str, ...]


LAYOUTS = (
    DemoLayout(2, (*Layout(ep=2).to_argv(), "--dispatcher", "alltoall")),
    DemoLayout(2, (*Layout(ep=2).to_argv(), "--dispatcher", "allgather")),
    DemoLayout(2, tuple(Layout(tp=2).to_argv())),
)


def reference(hf_dir: Path, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "mcore_dapo_checks.tiny", "reference", str(hf_dir), str(out)],
                   check=True, capture_output=True, text=True)


def convert_round_trip(hf_dir: Path, workdir: Path) -> dict:
    from mcore_dapo.bridge import Layout
    from mcore_dapo.convert.api import hf2mcore, mcore2hf
    from mcore_dapo.convert.verify import verify

    t0 = time.time()
    m = hf2mcore(hf_dir, workdir / "mcore-ep2", Layout(ep=2), progress=False, overwrite=True)
    v = verify(hf_dir, workdir / "mcore-ep2", Layout(tp=2))
    back = mcore2hf(workdir / "mcore-ep2", workdir / "hf-back", nproc=2, progress=False, overwrite=True)
    return {
        "written_under": "EP2", "loaded_under": v["layout"], "tensors": m["tensor_count"],
        "verify_max_abs_diff": v["max_abs_diff"], "verify_passed": v["passed"],
        "back_to_hf_tensors": back["tensors"], "back_to_hf_checksum_mismatches": len(back["checksum_mismatches"]),
        "passed": v["passed"] and not back["checksum_mismatches"] and back["tensors"] == m["tensor_count"],
        "seconds": round(time.time() - t0, 1),
    }


def rollout_sync(hf_dir: Path, ref: Path) -> dict:
    r = torchrun("mcore_dapo_checks.check_weight_sync", ["--hf-path", str(hf_dir), "--reference", str(ref), "--train",
                                                 *Layout(ep=2).to_argv()], 2)
    big = r["export_big"]
    return {
        "layout": r["layout"], "tensors": big["tensors"], "buckets": big["buckets"],
        "collectives": big["collectives"]["total"], "per_tensor_collectives": big["per_tensor_collectives"],
        "export_mismatches": big["mismatches"], "rollout_vs_hf_max_abs_diff": r["receiver_vs_reference"],
        "weights_changed_by_step": r["changed_fraction"],
        "rollout_vs_trained_megatron_max_abs_diff": r["trained_receiver_vs_megatron"],
        "passed": big["mismatches"] == 0 and r["receiver_vs_reference"] < TOLERANCE
        and r["trained_receiver_vs_megatron"] < TOLERANCE and r["changed_fraction"] > 0.5,
    }


def _update_and_reference(module: str, hf_dir: Path, work: Path) -> tuple[dict, dict] | None:
    """``module`` (an EP2 update under torchrun) and then the one-process HF reference of the same update."""
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        return None
    work.mkdir(exist_ok=True)
    got = torchrun(module, ["--hf-path", str(hf_dir), "--work", str(work), *Layout(ep=2).to_argv()], 2)
    ref = subprocess.run([sys.executable, "-m", "mcore_dapo_checks.verl_dapo", "reference", "--hf-path",
                          str(hf_dir), "--work", str(work)], check=True, capture_output=True, text=True)
    return got, json.loads(ref.stdout.strip().splitlines()[-1])


NO_VERL = {"skipped": "verl is not installed (pip install -e '.[verl]')"}


def dapo_update(hf_dir: Path, workdir: Path) -> dict:
    pair = _update_and_reference("mcore_dapo_checks.verl_dapo", hf_dir, workdir / "dapo")
    if pair is None:
        return NO_VERL
    got, want = pair
    return {
        "layout": got["layout"], "loss": got["loss"], "reference_loss": want["loss"],
        "grad_norm": got["grad_norm"], "reference_grad_norm": want["grad_norm"],
        "rollout_weights_vs_reference_max_abs_diff": want["max_weight_diff"],
        "passed": abs(got["loss"] - want["loss"]) <= 1e-4 * abs(want["loss"]) + 1e-6
        and abs(got["grad_norm"] - want["grad_norm"]) <= 1e-4 * want["grad_norm"]
        and want["max_weight_diff"] < 1e-4,
    }


def verl_engine_update(hf_dir: Path, workdir: Path) -> dict:
    pair = _update_and_reference("mcore_dapo_checks.verl_engine", hf_dir, workdir / "verl-engine")
    if pair is None:
        return NO_VERL
    got, want = pair
    return {
        "engine": got["engine"], "layout": got["layout"], "loss": got["loss"], "reference_loss": want["loss"],
        "grad_norm": got["grad_norm"], "reference_grad_norm": want["grad_norm"],
        "received_vs_engine": got["received_vs_engine"], "bf16_beyond_one_step": want["bf16_beyond_one_step"],
        "passed": "McoreDapoEngine" in got["engine_classes"]
        and abs(got["loss"] - want["loss"]) <= 2e-2 * abs(want["loss"])
        and abs(got["grad_norm"] - want["grad_norm"]) <= 1e-2 * want["grad_norm"]
        and got["received_vs_engine"] == 0.0 and want["bf16_beyond_one_step"] < 0.05,
    }


def verl_trainer(workdir: Path, steps: int = 4) -> dict:
    import importlib.util
    import shutil

    if importlib.util.find_spec("verl") is None or importlib.util.find_spec("transfer_queue") is None:
        return {"skipped": "verl / TransferQueue are not installed (pip install -r requirements/lock-verl.txt)"}
    from mcore_dapo_checks.tiny_dapo import per_step as step_rows
    from mcore_dapo_checks.tiny_dapo import run

    rollout = "vllm" if importlib.util.find_spec("vllm") is not None else "hf_cpu"
    # a fresh run each time: the launch scripts resume (resume_mode=auto) from an earlier demo's checkpoints,
    # which would leave nothing to train
    shutil.rmtree(workdir / "tiny-dapo" / "checkpoints", ignore_errors=True)
    r = run(workdir / "tiny-dapo", steps, timeout=1200, audit=True, rollout=rollout)
    per_step = step_rows(r) if r["steps"] else []
    return {"rollout": rollout, "steps": per_step, "seconds": r["seconds"], "metrics_log": r["metrics_log"],
            "plot": r.get("plot"), "train_log": r["train_log"],
            "passed": r["returncode"] == 0 and len(per_step) == steps
            # tests/test_verl_trainer.py's bounds: one or two bf16 steps of a probability; the grad norm's
            and all(p["rollout_vs_actor"] is not None and p["rollout_vs_actor"] < 2e-2 for p in per_step)
            and all(p["reference_grad_norm"] is not None
                    and abs(p["grad_norm"] - p["reference_grad_norm"]) <= 1e-2 * p["reference_grad_norm"] + 5e-3
                    for p in per_step)}


def run_demo(workdir: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    from mcore_dapo_checks.tiny import make_tiny_model

    t0 = time.time()
    steps = tqdm(total=7 + len(LAYOUTS), desc="demo", disable=not progress, file=sys.stderr)

    def step(label: str, fn, *args):
        steps.set_postfix_str(label)
        out = fn(*args)
        steps.update()
        return out

    hf_dir = workdir / "tiny-qwen3-moe"
    step("generating tiny Qwen3-MoE", make_tiny_model, hf_dir)
    ref = workdir / "hf-reference.pt"
    step("HF reference logits (clean process)", reference, hf_dir, ref)
    runs = []
    for lay in LAYOUTS:
        r = step(" ".join(lay.args), torchrun, "mcore_dapo_checks.logits",
                 ["--hf-path", str(hf_dir), "--reference", str(ref), "--backward", *lay.args], lay.nproc)
        r["passed"] = (r["max_abs_diff"] < TOLERANCE and r["grads_finite"] and r["grad_max_rel_err"] < TOLERANCE
                       and r["grads_compared"] == r["grads_reference"])
        runs.append(r)
    conversion = step("conversion round trip", convert_round_trip, hf_dir, workdir)
    sync = step("train one step, sync to the rollout model", rollout_sync, hf_dir, ref)
    dapo = step("DAPO update with verl's functions", dapo_update, hf_dir, workdir)
    engine = step("DAPO update through verl's Megatron engine", verl_engine_update, hf_dir, workdir)
    trainer = step("verl's DAPO trainer, 4 steps with the launch scripts' settings (Ray, verl's vLLM rollout)",
                   verl_trainer, workdir)
    steps.close()
    cfg = json.loads((hf_dir / "config.json").read_text())
    return {
        "model": {k: cfg[k] for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                      "num_key_value_heads", "num_local_experts", "num_experts_per_tok",
                                      "moe_intermediate_size", "vocab_size") if k in cfg},
        "hf_path": str(hf_dir),
        "tolerance": TOLERANCE,
        "layouts": runs,
        "conversion": conversion,
        "rollout_sync": sync,
        "dapo_update": dapo,
        "verl_engine_update": engine,
        "verl_trainer": trainer,
        "passed": all(r["passed"] for r in runs) and conversion["passed"] and sync["passed"]
        and dapo.get("passed", True) and engine.get("passed", True) and trainer.get("passed", True),
        "seconds": round(time.time() - t0, 1),
    }


def _shown(path: str | None) -> str | None:
    """A path below the current folder as a relative one (what the user typed for --workdir)."""
    import os

    if path is None:
        return None
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def render(summary: dict) -> str:
    m = summary["model"]
    lines = [
        "mcore-dapo demo: HF transformers vs the bridge's sharded Megatron model (float32, CPU, gloo)",
        f"model: tiny {m['model_type']}, {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, "
        f"{m.get('num_local_experts', 0)} experts top-{m.get('num_experts_per_tok', 0)}, vocab {m['vocab_size']}",
        "",
        f"{'layout':22s} {'procs':>5s} {'dispatcher':>10s} {'max|dlogit|':>12s} {'top-1':>6s} {'loss':>8s} {'HF loss':>8s} {'grad err':>9s} {'s':>6s}  result",
    ]
    for r in summary["layouts"]:
        lines.append(
            f"{r['layout']:22s} {r['world_size']:5d} {r['dispatcher']:>10s} {r['max_abs_diff']:12.2e} "
            f"{r['top1_agreement']:6.2f} {r['train_loss']:8.4f} {r['reference_loss']:8.4f} {r['grad_max_rel_err']:9.1e} "
            f"{r['seconds']:6.1f}  {'PASS' if r['passed'] else 'FAIL'}"
        )
    c = summary["conversion"]
    lines += [
        "",
        f"conversion: hf2mcore under {c['written_under']} -> torch_dist ({c['tensors']} HF tensors); loaded under "
        f"{c['loaded_under']}: max|dlogit| {c['verify_max_abs_diff']:.2e}; mcore2hf back: {c['back_to_hf_tensors']} "
        f"tensors, {c['back_to_hf_checksum_mismatches']} differ from the original  "
        f"{'PASS' if c['passed'] else 'FAIL'} ({c['seconds']} s)",
    ]
    y = summary["rollout_sync"]
    lines += [
        f"rollout sync ({y['layout']}): {y['tensors']} tensors in {y['buckets']} bucket(s), {y['collectives']} "
        f"collectives (per-tensor: {y['per_tensor_collectives']}), export bit-exact: {y['export_mismatches'] == 0}; "
        f"rollout vs HF max|dlogit| {y['rollout_vs_hf_max_abs_diff']:.2e}; after an Adam step and a second sync, "
        f"rollout vs trained Megatron {y['rollout_vs_trained_megatron_max_abs_diff']:.2e}  "
        f"{'PASS' if y['passed'] else 'FAIL'}",
    ]
    d = summary["dapo_update"]
    if "skipped" in d:
        lines.append(f"DAPO update: skipped ({d['skipped']})")
    else:
        lines.append(
            f"DAPO update with verl's loss ({d['layout']}): loss {d['loss']:.7f} vs one-process reference "
            f"{d['reference_loss']:.7f}, grad norm {d['grad_norm']:.6f} vs {d['reference_grad_norm']:.6f}; "
            f"rollout weights vs reference max|d| {d['rollout_weights_vs_reference_max_abs_diff']:.1e}  "
            f"{'PASS' if d['passed'] else 'FAIL'}")
    e = summary["verl_engine_update"]
    if "skipped" in e:
        lines.append(f"verl engine update: skipped ({e['skipped']})")
    else:
        lines.append(
            f"DAPO update through verl's engine ({e['engine']}, {e['layout']}, bf16): loss {e['loss']:.5f} vs fp32 "
            f"reference {e['reference_loss']:.5f}, grad norm {e['grad_norm']:.4f} vs {e['reference_grad_norm']:.4f}; "
            f"rollout received the engine's weights exactly: {e['received_vs_engine'] == 0.0}, "
            f"{100 * e['bf16_beyond_one_step']:.1f}% of elements more than one bf16 step from the fp32 update  "
            f"{'PASS' if e['passed'] else 'FAIL'}")
    t = summary["verl_trainer"]
    if "skipped" in t:
        lines.append(f"verl trainer: skipped ({t['skipped']})")
    else:
        lines.append(f"verl's DAPO trainer on the CPU ({len(t['steps'])} steps in {t['seconds']} s, Megatron EP2 actor, "
                     f"{t['rollout']} rollout)  {'PASS' if t['passed'] else 'FAIL'}")
        lines.append("  step   score mean   val acc   grad norm   HF reference   groups dropped   "
                     "rollout vs actor max|dp|   step s")
        for p in t["steps"]:
            ref, val = p["reference_grad_norm"], p.get("val_acc")
            lines.append(f"  {p['step']:>4}   {p['score']:>10.3f}   {'-' if val is None else format(val, '.3f'):>7}   "
                         f"{p['grad_norm']:>9.4f}   {'-' if ref is None else format(ref, '.4f'):>12}   "
                         f"{p['evicted']:>14.0f}   {p['rollout_vs_actor']:>24.1e}   {p['seconds']:>6.1f}")
        lines.append(f"  metrics: {_shown(t['metrics_log'])}   plot: {_shown(t['plot'])}")
    lines += ["", f"tolerance {summary['tolerance']:.0e}; {'all passed' if summary['passed'] else 'FAILED'} "
              f"in {summary['seconds']} s"]
    return "\n".join(lines)


def main(workdir: str | None, as_json: bool) -> int:
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        summary = run_demo(Path(workdir), progress=not as_json)
    else:
        with tempfile.TemporaryDirectory(prefix="mcore-dapo-demo-") as tmp:
            summary = run_demo(Path(tmp), progress=not as_json)
    print(json.dumps(summary, indent=1) if as_json else render(summary))
    return 0 if summary["passed"] else 1
