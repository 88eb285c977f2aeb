"""verl 0.6.1 (the guide's image has verl 0.6.x): the plugin refuses in one line with the upgrade path, and
the converters, resharding, the planner and `mcore-dapo env` work with it installed (docs/ASCEND.md).

verl 0.6.1 comes from the package index (``pip install --no-deps --target``) and is put first on the
path of the commands run here; its dependencies are those of this environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VERL = "0.6.1"


@pytest.fixture(scope="module")
def verl061(tmp_path_factory) -> dict:
    target = tmp_path_factory.mktemp("verl-0.6.1")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--target", str(target), f"verl=={VERL}"], capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"verl {VERL} could not be installed from the package index: {p.stderr.strip().splitlines()[-1:]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return env


def run(env, *args, timeout=600):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(REPO))


def test_plugin_refuses_verl_061_in_one_line_with_the_upgrade_path(verl061):
    p = run(verl061, "-c", "import verl; print(verl.__version__)")
    assert p.stdout.strip() == VERL, p.stderr[-2000:]
    p = run(verl061, "-m", "mcore_dapo.verl_plugin.main_dapo", "actor_rollout_ref.actor.strategy=megatron")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: verl {VERL} is not supported by mcore_dapo.verl_plugin (its actor.strategy=megatron runs "
        "verl/workers/megatron_workers.py, not the engine API this plugin registers with): supported is "
        "verl>=0.9.1,<0.10; upgrade with pip install verl==0.9.1"], p.stderr


def test_env_and_planner_work_with_verl_061(verl061):
    p = run(verl061, "-m", "mcore_dapo.cli.main", "env", "--json", "--device", "cpu")
    assert p.returncode == 0, p.stderr[-2000:]
    info = json.loads(p.stdout)
    assert info["versions"]["verl"] == VERL
    verl_patch = next(x for x in info["patches"] if x["id"] == "verl.cpu.process-group")
    assert not verl_patch["applies"] and f"verl {VERL} is outside" in verl_patch["why_not"]
    p = run(verl061, "-m", "mcore_dapo.cli.main", "plan", "--model", "configs/models/qwen3-30b-a3b", "--nodes", "4",
            "--devices-per-node", "8", "--device", "a2")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "trainer.nnodes=4" in p.stdout


@pytest.mark.cpu_only
def test_converters_and_resharding_work_with_verl_061(verl061, tiny_moe, tmp_path):
    p = run(verl061, "-m", "mcore_dapo.cli.convert", "hf2mcore", "--hf-path", tiny_moe, "--out", tmp_path / "mc",
            "--ep", "2", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run(verl061, "-m", "mcore_dapo.cli.convert", "mcore2hf", "--mcore-path", tmp_path / "mc", "--hf-config",
            tiny_moe, "--out", tmp_path / "hf", "--nproc", "2", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    back = json.loads(p.stdout.strip().splitlines()[-1])
    assert back["checked_against_manifest"] and back["checksum_mismatches"] == []  # bit-exact round trip
    p = run(verl061, "-m", "mcore_dapo.cli.main", "sync-bench", "--hf-path", tiny_moe, "--ep", "2", "--repeat", "1",
            "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["bit_exact"] is True
