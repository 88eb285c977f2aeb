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
def verl061(tmp_path_factory) -> tuple[dict, Path]:
    target = tmp_path_factory.mktemp("verl-0.6.1")
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "--target", str(target), f"verl=={VERL}"], capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"verl {VERL} could not be installed from the package index: {p.stderr.strip().splitlines()[-1:]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return env, target


# Runs `python -m MODULE ARGS` in a process that first imports verl and writes its version and file as the
# first line of stderr: the command then runs beside that verl (any import of verl it makes gets it).
WITH_VERL = ("import runpy, sys, verl; print('verl', verl.__version__, verl.__file__, file=sys.stderr, flush=True); "
             "mod = sys.argv[1]; sys.argv = [mod, *sys.argv[2:]]; runpy.run_module(mod, run_name='__main__', "
             "alter_sys=True)")


def run(verl061, module, *args, timeout=600) -> subprocess.CompletedProcess:
    """``python -m module args`` with verl 0.6.1 imported in the same process; asserts that it was verl 0.6.1
    from the fixture's folder, and returns the result with that first stderr line taken off."""
    env, target = verl061
    p = subprocess.run([sys.executable, "-c", WITH_VERL, module, *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=timeout, cwd=str(REPO))
    first, _, rest = p.stderr.partition("\n")
    assert first == f"verl {VERL} {target / 'verl' / '__init__.py'}", p.stderr[-2000:]
    p.stderr = rest
    return p


def test_plugin_refuses_verl_061_in_one_line_with_the_upgrade_path(verl061):
    p = run(verl061, "mcore_dapo.verl_plugin.main_dapo", "actor_rollout_ref.actor.strategy=megatron")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: verl {VERL} is not supported by mcore_dapo.verl_plugin (its actor.strategy=megatron runs "
        "verl/workers/megatron_workers.py, not the engine API this plugin registers with): supported is "
        "verl>=0.9.1,<0.10; upgrade with pip install verl==0.9.1"], p.stderr


def test_env_and_planner_work_with_verl_061(verl061):
    p = run(verl061, "mcore_dapo.cli.main", "env", "--json", "--device", "cpu")
    assert p.returncode == 0, p.stderr[-2000:]
    info = json.loads(p.stdout)
    assert info["versions"]["verl"] == VERL
    verl_patch = next(x for x in info["patches"] if x["id"] == "verl.cpu.process-group")
    assert not verl_patch["applies"] and f"verl {VERL} is outside" in verl_patch["why_not"]
    p = run(verl061, "mcore_dapo.cli.main", "plan", "--model", "configs/models/qwen3-30b-a3b", "--nodes", "4",
            "--devices-per-node", "8", "--device", "a2")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "trainer.nnodes=4" in p.stdout


@pytest.mark.cpu_only
def test_converters_and_resharding_work_with_verl_061(verl061, tiny_moe, tmp_path):
    p = run(verl061, "mcore_dapo.cli.convert", "hf2mcore", "--hf-path", tiny_moe, "--out", tmp_path / "mc",
            "--ep", "2", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run(verl061, "mcore_dapo.cli.convert", "mcore2hf", "--mcore-path", tmp_path / "mc", "--hf-config",
            tiny_moe, "--out", tmp_path / "hf", "--nproc", "2", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    back = json.loads(p.stdout.strip().splitlines()[-1])
    assert back["checked_against_manifest"] and back["checksum_mismatches"] == []  # bit-exact round trip
    p = run(verl061, "mcore_dapo.cli.main", "sync-bench", "--hf-path", tiny_moe, "--ep", "2", "--repeat", "1",
            "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["bit_exact"] is True
