"""A DAPO policy update with verl's own algorithm functions on Megatron (EP2, 2 processes, gloo),
against the same update of the HF transformers model in one process; then the rollout sync."""

import pytest

pytest.importorskip("verl")

from mcore_dapo.runtime.launch import torchrun  # noqa: E402

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo


def test_dapo_update_matches_single_process_reference(tmp_path):
    import subprocess
    import sys
    import json

    from mcore_dapo.harness.tiny import make_tiny_model

    hf = make_tiny_model(tmp_path / "tiny")
    work = tmp_path / "work"
    work.mkdir()
    got = torchrun("mcore_dapo.harness.verl_dapo", ["--hf-path", str(hf), "--work", str(work), "--ep", "2"], 2,
                   timeout=300)
    ref = subprocess.run([sys.executable, "-m", "mcore_dapo.harness.verl_dapo", "reference", "--hf-path", str(hf),
                          "--work", str(work)], capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    want = json.loads(ref.stdout.strip().splitlines()[-1])
    assert got["layout"] == "TP1 PP1 EP2 ETP1" and got["world_size"] == 2
    assert min(got["rewards"]) < -1.0  # the overlong penalty of the dapo reward manager acted
    assert got["metrics"]["actor/pg_clipfrac"] > 0  # the clip range acted
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
    assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
    # the rollout received the updated weights: equal to the reference update, far below the update itself
    assert want["max_update"] > 1e-4
    assert want["max_weight_diff"] < 1e-4
