"""The verl plugin: override rewriting, DRY_RUN of the DAPO scripts (valid and invalid layouts), engine registration."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from mcore_dapo.errors import UserError  # noqa: E402
from mcore_dapo.verl_plugin.overrides import rewrite, rewrite_main_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_strategy_megatron_implies_model_engine():
    assert rewrite(["a=1", "actor_rollout_ref.actor.strategy=megatron"])[0] == "model_engine=megatron"
    assert rewrite(["actor_rollout_ref.actor.strategy=fsdp"]) == ["actor_rollout_ref.actor.strategy=fsdp"]
    same = ["model_engine=megatron", "actor_rollout_ref.actor.strategy=megatron"]
    assert rewrite(same) == same
    with pytest.raises(UserError, match="contradicts model_engine=dp"):
        rewrite(["model_engine=dp", "actor_rollout_ref.actor.strategy=megatron"])


def test_main_ppo_argv_is_rewritten_only_for_verl_main():
    argv = ["main_ppo.py", "actor_rollout_ref.actor.strategy=megatron"]
    assert rewrite_main_argv(argv, ["python", "-m", "verl.trainer.main_ppo", *argv[1:]])
    assert argv[1] == "model_engine=megatron"
    other = ["x.py", "actor_rollout_ref.actor.strategy=megatron"]
    assert not rewrite_main_argv(other, ["python", "x.py", *other[1:]])


def dry_run(script: str, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "configs" / script), *overrides], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("script, want", [
    ("dapo_qwen3_30b_h100.sh", {"tp": 2, "pp": 1, "ep": 8, "etp": 1, "dp": 16, "edp": 4, "world_size": 32}),
    ("dapo_qwen3_30b_a2.sh", {"tp": 1, "pp": 2, "ep": 8, "vpp": 2, "dp": 16, "edp": 2, "world_size": 32}),
])
def test_dry_run_valid(script, want):
    p = dry_run(script)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8"], "does not divide the 4 KV groups"),
    (["trainer.nnodes=3", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=3",
      "actor_rollout_ref.ref.megatron.expert_model_parallel_size=3"], "does not divide the 128 experts"),
    (["actor_rollout_ref.ref.megatron.expert_model_parallel_size=4"], "and ref layout"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=4"], "world size 4 is not divisible by ETP*EP*PP = 8"),
    (["trainer.nnodes=3"], "ppo_mini_batch_size*rollout.n = 512 is not divisible by the data-parallel size 12"),
])
def test_dry_run_invalid(overrides, message):
    p = dry_run("dapo_qwen3_30b_h100.sh", *overrides)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("error: ")


def test_engine_registered_for_cpu_after_verl_engine_import():
    code = ("import sys, verl; assert 'megatron' not in sys.modules; import verl.workers.engine as e; "
            "r = e.EngineRegistry._engines['language_model']['megatron']; "
            "print(sorted(map(str, r)), r['cpu'].__name__)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "McoreDapoEngine" in p.stdout and "('cuda', 'nvidia')" in p.stdout
