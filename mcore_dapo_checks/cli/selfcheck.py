"""``mcore-dapo selfcheck``: one prepared command that proves a node (CUDA, Ascend or the CPU) in minutes.

Steps, in order; each is timed and given a verdict (``pass``, ``fail`` or ``skipped: <reason>``), and a
failed step does not hide the others:

1. ``env``: versions, the device, Transformer Engine / MindSpeed, the patches that apply, the fast paths that run
   (every model below is built with them: ``runtime.model.build_model``);
2. ``model``: on an accelerator, Qwen3-30B-A3B at its real width (hidden 2048, 32 heads / 4 KV groups,
   head_dim 128, 128 experts top-8, expert ffn 768, vocab 151936) truncated to ``--layers`` layers with
   seeded random weights (HF safetensors, no download); on the CPU the tiny Qwen3-MoE (head_dim 32, which
   vLLM's CPU attention accepts). The HF reference
   logits are computed in a clean process on the CPU, in fp32;
3. ``megatron_vs_hf``: Megatron on the device (TE spec on CUDA when TE imports, MindSpeed's on Ascend,
   local on the CPU) against HF, under the largest layout ``--nproc`` allows (EP up to nproc, TP 2 from 4
   devices); fp32 on the CPU (max |dlogit| < 1e-4, top-1 1.0), bf16 on accelerators (mean |dlogit| < 0.05,
   top-1 >= 0.9 against the fp32 reference);
4. ``convert_roundtrip``: hf2mcore then mcore2hf (both run on the CPU under gloo), bit-exact, GB/s;
5. ``export``: the rollout exporter (resharding) under the same layout on the device: every tensor
   bit-exact against the checkpoint, seconds, GB/s and the memcpy bound measured in the same run;
6. ``rollout_sync``: the exporter's stream into the rollout engine itself (vLLM's CPU build, vLLM on CUDA,
   vllm-ascend) through verl's ``ServerAdapter.update_weights``, the engine started on dummy weights and
   colocated with rank 0 (:mod:`mcore_dapo_checks.bench_vllm_sync`): the engine's parameters equal the export
   bit for bit, seconds, GB/s, and vLLM's log-probs against HF's on the same weights (< 1e-4 in fp32;
   reported, not judged, in bf16, where the two use different kernels); then the engine's time per decode step
   (eager) at batch 1, 8 and 32: the measurement that settles the planner's per-step overhead (docs/PLANNER.md);
7. ``dapo_update``: one DAPO update through verl's engine path with this plugin's engine (packed
   sequences where the device supports them): tokens/s, peak memory, the planner's prediction.

``W/selfcheck.json`` and ``W/selfcheck.md`` hold the report. The command exits 1 only when a step that
ran has failed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from mcore_dapo.bridge import Bridge, Layout, load_hf_config
from mcore_dapo.errors import UserError
from mcore_dapo.io.output import write_text_atomically
from mcore_dapo.resources import model_config

REAL_CONFIG = model_config("qwen3-30b-a3b")
STEPS = ("env", "model", "megatron_vs_hf", "convert_roundtrip", "export", "rollout_sync", "dapo_update")
# rough lower bounds of each step's time (seconds) on an accelerator node / the CPU, for --budget-s
NEEDS = {"model": (150, 10), "megatron_vs_hf": (60, 40), "convert_roundtrip": (120, 60), "export": (60, 30),
         "rollout_sync": (90, 60), "dapo_update": (180, 150)}
# rollout_sync also times the engine's decode steps at these batch sizes (eager): the planner's per-step overhead is
# a guess until a device measures it (docs/PLANNER.md, "What would settle the guess")
DECODE_BATCHES = "1,8,32"
CPU_HEAD_DIM = 32  # the tiny model's default 16 is refused by vLLM's CPU attention
LOGPROB_TOLERANCE_FP32 = 1e-4  # vLLM vs HF log-probs on the same fp32 weights
# megatron_vs_hf: logits, the training loss and every parameter's gradient against the fp32 HF reference
# (docs/SELFCHECK.md argues each bound; fp32 ones are tests/test_megatron_vs_hf.py's)
TOLERANCE = {"fp32": {"max_abs_diff": 1e-4, "top1_agreement": 1.0, "loss_rel_diff": 2e-6, "grad_max_rel_err": 1e-4},
             "bf16": {"mean_abs_diff": 0.05, "top1_agreement": 0.9, "loss_rel_diff": 5e-3, "grad_global_rel_l2": 0.1}}
# dapo_update: verl's update on the engine (bf16, as verl runs it) against the same update of the fp32 HF
# model in one process (tests/test_verl_engine.py's bounds)
UPDATE_TOLERANCE = {"loss_rel": 2e-2, "grad_norm_rel": 1e-2, "bf16_beyond_one_step": 0.05}


class Skip(Exception):
    """A step that cannot run here; its message is the reason."""


@dataclass
class StepReport:
    name: str
    verdict: str
    seconds: float
    reason: str | None = None
    result: dict = field(default_factory=dict)


def choose_layout(cfg, nproc: int) -> Layout:
    """The largest layout ``nproc`` devices allow: EP up to nproc, TP 2 from 4 devices, ETP 1."""
    ep = max(d for d in range(1, nproc + 1) if nproc % d == 0 and cfg.num_experts % d == 0) if cfg.is_moe else 1
    tp = 2 if nproc >= 4 and nproc % 2 == 0 and cfg.num_key_value_heads % 2 == 0 else 1
    return Layout(tp=tp, ep=ep, etp=1).validate(cfg, nproc)


def within(result: dict, dtype: str) -> bool:
    """Whether a logits comparison is inside the tolerance of its dtype."""
    tol = TOLERANCE[dtype]
    return all(result[k] >= v if k == "top1_agreement" else result[k] < v for k, v in tol.items())


class SelfCheck:
    def __init__(self, device: str, nproc: int, workdir: Path, budget_s: float, layers: int = 2,
                 config: Path = REAL_CONFIG, progress: Callable[[str], None] = lambda s: None):
        from mcore_dapo.devices import get_adapter

        if nproc < 1:
            raise UserError(f"nproc={nproc} is not accepted: a positive integer is")
        if layers < 1:
            raise UserError(f"layers={layers} is not accepted: a positive integer is")
        self.adapter = get_adapter(device)
        self.device, self.nproc, self.layers, self.config = self.adapter.name, nproc, layers, Path(config)
        self.work = Path(workdir).absolute()
        self.budget_s, self.progress = budget_s, progress
        self.accelerator = self.adapter.has_device_memory()
        self.dtype = "bf16" if self.accelerator else "fp32"
        self.t0 = time.monotonic()
        self.model: Path | None = None
        self.layout: Layout | None = None
        self.mcore: Path | None = None

    # ---- the steps -------------------------------------------------------------------------------

    def step_env(self) -> dict:
        from mcore_dapo import env

        return env.collect(self.device)

    def step_model(self) -> dict:
        from mcore_dapo_checks.tiny import make_tiny_model, make_truncated_model

        self._device_present()
        model, ref = self.work / "model", self.work / "reference.pt"
        if self.accelerator:  # a config that is missing is config_path's one-line error
            make_truncated_model(model, self.config, self.layers)
        else:
            make_tiny_model(model, seed=0, head_dim=CPU_HEAD_DIM)
        cfg = load_hf_config(model)
        self.layout = choose_layout(cfg, self.nproc)
        # the reference's training loss runs over the logits of the layout's padded output layer
        padded = Bridge(cfg, self.layout).dims.padded_vocab_size
        seq = "64" if self.accelerator else "16"
        dp = self.layout.dp(self.nproc)  # 4 sequences or one for each data-parallel rank, the same number each
        batch = str(-(-max(4, dp) // dp) * dp)
        subprocess.run([sys.executable, "-m", "mcore_dapo_checks.tiny", "reference", str(model), str(ref),
                        "--seq", seq, "--batch", batch, "--padded-vocab", str(padded)],
                       check=True, capture_output=True, text=True)
        self.model = model
        return {"path": str(model), "layers": cfg.num_layers, "hidden": cfg.hidden_size, "experts": cfg.num_experts,
                "vocab": cfg.vocab_size, "bytes": sum(f.stat().st_size for f in model.glob("*.safetensors")),
                "layout": self.layout.describe()}

    def step_megatron_vs_hf(self) -> dict:
        r = self._torchrun("mcore_dapo_checks.logits",
                           ["--hf-path", str(self._model()), "--reference", str(self.work / "reference.pt"),
                            "--device", self.device, "--dtype", self.dtype, "--backward", *self.layout.to_argv()])
        r["tolerance"] = TOLERANCE[self.dtype]
        r["ok"] = within(r, self.dtype)
        return r

    def step_convert_roundtrip(self) -> dict:
        from mcore_dapo.convert.api import hf2mcore, mcore2hf

        model = self._model()
        t = time.monotonic()
        manifest = hf2mcore(model, self.work / "mcore", self.layout, nproc=self.nproc, overwrite=True, progress=False)
        t_in = time.monotonic() - t
        t = time.monotonic()
        back = mcore2hf(self.work / "mcore", self.work / "hf-back", nproc=self.nproc, overwrite=True, progress=False)
        t_out = time.monotonic() - t
        self.mcore = self.work / "mcore"
        differ = _differing_tensors(model, self.work / "hf-back")
        gb = manifest["source"]["bytes"] / 1e9
        return {"runs_on": "cpu (gloo)", "tensors": back["tensors"], "bytes": manifest["source"]["bytes"],
                "hf2mcore_seconds": round(t_in, 2), "mcore2hf_seconds": round(t_out, 2),
                "hf2mcore_gbps": float(f"{gb / t_in:.4g}"), "mcore2hf_gbps": float(f"{gb / t_out:.4g}"),
                "bit_exact": not differ, "first_difference": differ[0] if differ else None, "ok": not differ}

    def step_export(self) -> dict:
        r = self._torchrun("mcore_dapo_checks.bench_weight_sync",
                           ["--hf-path", str(self._model()), "--device", self.device, *self.layout.to_argv()])
        r["ok"] = bool(r["bit_exact"])
        return r

    def step_rollout_sync(self) -> dict:
        engine = self.adapter.rollout.package
        if importlib.util.find_spec(engine) is None:
            raise Skip(f"{engine} is not installed ({self.adapter.rollout.install})")
        if importlib.util.find_spec("verl") is None:  # the weights go through verl's own ServerAdapter
            raise Skip("verl is not installed (pip install 'mcore-dapo[verl]')")
        r = self._torchrun("mcore_dapo_checks.bench_vllm_sync",
                           ["--hf-path", str(self._model()), "--device", self.device, "--repeat", "2",
                            "--decode-batches", DECODE_BATCHES, *self.layout.to_argv()])
        r["logprob_tolerance"] = LOGPROB_TOLERANCE_FP32 if self.dtype == "fp32" else None
        r["ok"] = bool(r["exact"]) and (self.dtype != "fp32" or r["logprob_max_diff"] < LOGPROB_TOLERANCE_FP32)
        return r

    def step_dapo_update(self) -> dict:
        if importlib.util.find_spec("verl") is None:
            raise Skip("verl is not installed (pip install 'mcore-dapo[verl]')")
        args = ["--hf-path", str(self._model()), "--work", str(self.work / "dapo"),
                *Layout(ep=self.layout.ep).to_argv()]  # the engine step at the layout's EP alone
        if self.adapter.fast.packed_sequences_supported():
            args.append("--remove-padding")
        (self.work / "dapo").mkdir(exist_ok=True)
        r = self._torchrun("mcore_dapo_checks.verl_engine", args)
        from mcore_dapo.plan.memory import OVERHEAD_GIB

        r["planner_peak_gib"] = round(planner_peak_gib(load_hf_config(self.model), self.layout, self.nproc), 3)
        # the allocator's peak holds no runtime context or communicator buffers: compared without the
        # planner's fixed overhead for those
        r["planner_allocated_gib"] = round(r["planner_peak_gib"] - OVERHEAD_GIB, 3)
        if r["peak_device_bytes"] is not None:
            r["peak_device_gib"] = round(r["peak_device_bytes"] / 2**30, 3)
            r["measured_over_planned"] = round(r["peak_device_gib"] / r["planner_allocated_gib"], 3)
        ref = subprocess.run([sys.executable, "-m", "mcore_dapo_checks.verl_dapo", "reference", "--hf-path",
                              str(self._model()), "--work", str(self.work / "dapo")],
                             capture_output=True, text=True, timeout=max(60.0, self.left()))
        if ref.returncode:
            last = (ref.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the fp32 HF reference of the update failed: {last}")
        want = json.loads(ref.stdout.strip().splitlines()[-1])
        tol = UPDATE_TOLERANCE
        r.update(reference_loss=want["loss"], reference_grad_norm=want["grad_norm"],
                 bf16_beyond_one_step=want.get("bf16_beyond_one_step"), update_tolerance=tol,
                 loss_rel_diff=abs(r["loss"] - want["loss"]) / max(abs(want["loss"]), 1e-30),
                 grad_norm_rel_diff=abs(r["grad_norm"] - want["grad_norm"]) / max(want["grad_norm"], 1e-30))
        beyond = r["bf16_beyond_one_step"]
        r["ok"] = (r["received_vs_engine"] == 0.0 and r["loss_rel_diff"] < tol["loss_rel"]
                   and r["grad_norm_rel_diff"] < tol["grad_norm_rel"]
                   and (beyond is None or beyond < tol["bf16_beyond_one_step"]))
        return r

    # ---- helpers -----------------------------------------------------------------------------------

    def _device_present(self) -> None:
        have = self.adapter.device_count()
        if have is None:  # processes on the host
            return
        if have == 0:
            raise Skip(f"no {self.device} device on this machine")
        if have < self.nproc:
            raise Skip(f"--nproc {self.nproc} needs {self.nproc} {self.device} devices, {have} visible")

    def _model(self) -> Path:
        if self.model is None:
            raise Skip("no model: the model step did not pass")
        return self.model

    def _torchrun(self, module: str, args: list[str]) -> dict:
        from mcore_dapo.runtime.launch import LaunchError, torchrun

        try:
            return torchrun(module, args, self.nproc, timeout=max(60.0, self.left()))
        except LaunchError as e:
            raise RuntimeError(str(e).splitlines()[-1] if str(e).strip() else "worker failed") from e

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def run_step(self, name: str) -> StepReport:
        need = NEEDS.get(name, (0, 0))[0 if self.accelerator else 1]
        if self.left() < need:
            return StepReport(name, "skipped", 0.0, f"budget: {self.left():.0f} s left, the step needs about {need} s")
        self.progress(f"selfcheck: {name} ...")
        t = time.monotonic()
        try:
            result = getattr(self, f"step_{name}")()
        except Skip as e:
            return StepReport(name, "skipped", round(time.monotonic() - t, 2), str(e))
        except Exception as e:  # a step that ran and broke: its verdict, not the end of the check
            return StepReport(name, "fail", round(time.monotonic() - t, 2), f"{type(e).__name__}: {e}")
        verdict = "fail" if result.get("ok") is False else "pass"
        return StepReport(name, verdict, round(time.monotonic() - t, 2), None, result)

    def run(self) -> dict:
        self.work.mkdir(parents=True, exist_ok=True)
        steps = [self.run_step(name) for name in STEPS]
        report = {"device": self.device, "nproc": self.nproc, "budget_s": self.budget_s,
                  "layout": self.layout.describe() if self.layout else None, "dtype": self.dtype,
                  "seconds": round(time.monotonic() - self.t0, 1), "ok": all(s.verdict != "fail" for s in steps),
                  "steps": [asdict(s) for s in steps]}
        write_report(report, self.work)
        return report


def planner_peak_gib(cfg, layout: Layout, nproc: int) -> float:
    """The planner's peak memory of one update (GiB, largest stage) for the batch of the dapo_update step."""
    from mcore_dapo_checks.verl_dapo import GROUPS, N, PROMPT, RESPONSE
    from mcore_dapo_checks.verl_engine import MICRO
    from mcore_dapo.plan import PlanLayout, Workload, get_device
    from mcore_dapo.plan.memory import estimate_memory

    # the device spec only sizes the rollout's share of memory, not the update's peak
    w = Workload(device=get_device("h200"), nodes=1, devices_per_node=nproc, max_prompt=PROMPT,
                 max_response=RESPONSE, micro_batch_tokens=MICRO * (PROMPT + RESPONSE), prompts=GROUPS,
                 responses_per_prompt=N, recompute="none")
    return max(s.update_total for s in estimate_memory(cfg, PlanLayout(layout), w))


def _differing_tensors(a: Path, b: Path) -> list[str]:
    import torch

    from mcore_dapo.io.hf_reader import HFReader

    with HFReader(a) as ra, HFReader(b) as rb:
        names = list(ra.keys())
        missing = [n for n in names if n not in rb]
        return missing or [n for n in names if not torch.equal(ra.get(n), rb.get(n))]


HEADLINE = {
    "megatron_vs_hf": lambda r: f"max abs dlogit {r['max_abs_diff']:.3g}, mean {r['mean_abs_diff']:.3g}, "
                                f"top-1 {r['top1_agreement']:.3f}, loss rel diff {r['loss_rel_diff']:.2g}, "
                                f"gradients rel diff max {r['grad_max_rel_err']:.2g} / global {r['grad_global_rel_l2']:.2g} "
                                f"({r['layout']}, {r['seconds']} s)",
    "convert_roundtrip": lambda r: f"bit-exact {r['bit_exact']}, hf2mcore {r['hf2mcore_gbps']:.3g} GB/s, "
                                   f"mcore2hf {r['mcore2hf_gbps']:.3g} GB/s ({r['bytes'] / 1e9:.3g} GB)",
    "export": lambda r: f"bit-exact {r['bit_exact']}, {r['seconds']} s, {r['gbps']:.3g} GB/s "
                        f"(memcpy {r['memcpy_gbps']:.3g} GB/s)",
    "rollout_sync": lambda r: f"engine == export {r['exact']}, {r['seconds']} s, {r['gbps']:.3g} GB/s "
                              f"(memcpy {r['memcpy_gbps']:.3g} GB/s), vLLM vs HF log-probs max abs diff "
                              f"{r['logprob_max_diff']:.3g}; decode step ms by batch "
                              f"{', '.join(f'{b}: {ms:g}' for b, ms in r.get('decode_step_ms', {}).items())}",
    "model": lambda r: f"{r['layers']} layers, hidden {r['hidden']}, {r['experts']} experts, "
                       f"{r['bytes'] / 1e9:.3g} GB, layout {r['layout']}",
    "env": lambda r: f"torch {r['versions']['torch']}, megatron-core {r['versions']['megatron-core']}, "
                     f"TE {r['versions']['transformer-engine']}, MindSpeed {r['versions']['mindspeed']}, fast paths on: "
                     f"{', '.join(p['setting'] for p in r.get('fast_paths', []) if p['on']) or 'none'}",
    "dapo_update": lambda r: f"loss {r['loss']:.4f} (fp32 HF {r['reference_loss']:.4f}), grad norm "
                             f"{r['grad_norm']:.4f} (HF {r['reference_grad_norm']:.4f}), sync diff "
                             f"{r['received_vs_engine']}, {r['tokens_per_second']} tokens/s, {_peak(r)}",
}


def _peak(r: dict) -> str:
    if "peak_device_gib" in r:
        return (f"peak allocated {r['peak_device_gib']} GiB (planner {r['planner_allocated_gib']} + "
                f"{r['planner_peak_gib'] - r['planner_allocated_gib']:.3g} overhead, ratio {r['measured_over_planned']})")
    return f"peak RSS {r['peak_rss_mb']:.0f} MiB (no device counter; planner {r['planner_peak_gib']} GiB)"


def markdown(report: dict) -> str:
    lines = [f"# selfcheck: {report['device']} x {report['nproc']}, {report['dtype']}, {report['seconds']} s",
             "", "| step | verdict | seconds | figures |", "| --- | --- | ---: | --- |"]
    for s in report["steps"]:
        verdict = s["verdict"] if s["reason"] is None else f"{s['verdict']}: {s['reason']}"
        figures = HEADLINE[s["name"]](s["result"]) if s["result"] and s["name"] in HEADLINE else ""
        lines.append(f"| {s['name']} | {verdict} | {s['seconds']} | {figures} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, work: Path) -> None:
    for name, text in (("selfcheck.json", json.dumps(report, indent=1)), ("selfcheck.md", markdown(report))):
        write_text_atomically(work / name, text)
