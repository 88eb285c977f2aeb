"""verl's own DAPO algorithm functions on Megatron logits (EP2, 2 processes, gloo, float32): the dapo reward
manager's rewards with the overlong penalty, GRPO advantages and verl's ``vanilla`` policy loss (clip
low/high, clip_ratio_c, token-mean over the global batch) give, on the bridge's sharded model, the loss the
same functions give on the HF transformers model in one process.

What this covers that nothing else does: verl's loss functions evaluated on Megatron's log-probs in
float32, to a tight bound (the engine tests run verl's whole update path in bf16, so their loss bound is
bf16's). Gradients are not checked here: their reduction is Megatron's DDP and optimizer, which
tests/test_megatron_vs_hf.py (every gradient against HF's) and tests/test_verl_engine.py (verl's
engine, its DDP and optimizer) check; the worker's own hand reduction (for the demo) is not the product's.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from mcore_dapo.runtime.launch import torchrun  # noqa: E402

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo


def test_verl_dapo_loss_on_megatron_equals_hf_in_fp32(tmp_path):
    from mcore_dapo_checks.tiny import make_tiny_model

    hf = make_tiny_model(tmp_path / "tiny")
    work = tmp_path / "work"
    work.mkdir()
    got = torchrun("mcore_dapo_checks.verl_dapo", ["--hf-path", str(hf), "--work", str(work), "--ep", "2"], 2,
                   timeout=300)
    ref = subprocess.run([sys.executable, "-m", "mcore_dapo_checks.verl_dapo", "reference", "--hf-path", str(hf),
                          "--work", str(work)], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    want = json.loads(ref.stdout.strip().splitlines()[-1])
    assert got["layout"] == "TP1 PP1 EP2 ETP1" and got["world_size"] == 2
    assert min(got["rewards"]) < -1.0  # the overlong penalty of the dapo reward manager acted
    assert got["metrics"]["actor/pg_clipfrac"] > 0  # the clip range acted
    # float32 on both sides; the log-probs agree to ~1e-6 (tests/test_megatron_vs_hf.py's logits bound), and
    # the loss is a token-mean of ratios of them: 1e-4 relative is fp32 rounding with two orders to spare,
    # while a wrong token-mean (per-rank instead of global tokens, the DP split) moves it by ~10 %
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
