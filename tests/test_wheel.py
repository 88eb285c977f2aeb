"""The package as a cluster image installs it: its wheel, built from this tree, installed without the checkout on
the path, run from another folder. The launch scripts, ``configs/dapo/common.sh`` and the model's config travel
in the wheel (``mcore_dapo/_configs``) and every command finds them there.

The wheel is installed with ``pip install --no-deps --target`` and run with this environment's dependencies
(torch, megatron-core, verl): what is checked is the project's own files, which the target alone provides (the
test asserts that ``mcore_dapo`` is imported from it, not from the checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    dist, target, away = base / "dist", base / "site", base / "elsewhere"
    away.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    r = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dist), str(REPO)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next(dist.glob("mcore_dapo-*.whl"))
    r = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    # the interpreter's own paths, this environment's site-packages, and the wheel's target first; not the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MCORE_DAPO_MODEL_CONFIG")}
    env.update(PYTHONPATH=str(target),  # the wheel's scripts first, then this environment's python3
               PATH=os.pathsep.join([str(target / "bin"), str(Path(sys.executable).parent), env["PATH"]]))
    return {"target": target, "away": away, "env": env, "wheel": wheel}


def run(w, *args, **kw):
    return subprocess.run(list(args), cwd=w["away"], env={**w["env"], **kw}, capture_output=True, text=True,
                          timeout=300)


def test_the_package_comes_from_the_wheel_with_its_files(wheel_env):
    w = wheel_env
    r = run(w, sys.executable, "-c", "import mcore_dapo, mcore_dapo.resources as r; print(mcore_dapo.__file__); "
            "print(r.configs_dir()); print(r.model_config())")
    assert r.returncode == 0, r.stderr
    module, configs, model = r.stdout.split()
    assert Path(module).is_relative_to(w["target"]) and Path(configs) == w["target"] / "mcore_dapo" / "_configs"
    assert (Path(model) / "config.json").is_file()
    for name in ("dapo_qwen3_30b_a2.sh", "dapo_qwen3_30b_h100.sh", "ray_start_master.sh", "dapo/common.sh"):
        assert (Path(configs) / name).is_file(), name


def test_plan_takes_the_shipped_model_by_name(wheel_env):
    r = run(wheel_env, "mcore-dapo", "plan", "--model", "qwen3-30b-a3b", "--nodes", "4", "--devices-per-node", "8",
            "--device", "h100", "--top", "1", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["candidates"][0]["fits"] and out["candidates"][0]["layout"]


def test_the_launch_scripts_written_from_the_wheel_dry_run(wheel_env):
    w = wheel_env
    r = run(w, "mcore-dapo", "scripts", "launch")
    assert r.returncode == 0, r.stderr
    r = run(w, "bash", str(w["away"] / "launch" / "dapo_qwen3_30b_a2.sh"), DRY_RUN="1")
    assert r.returncode == 0, r.stderr[-2000:]
    sizes = json.loads(r.stdout.splitlines()[-1])
    assert (sizes["pp"], sizes["ep"], sizes["world_size"]) == (2, 8, 32)
    r = run(w, "mcore-dapo", "scripts", "launch")  # an existing folder is not overwritten unasked
    assert r.returncode == 2 and "already exists: pass --overwrite" in r.stderr


def test_the_cpu_run_and_selfcheck_find_the_scripts_and_the_model(wheel_env):
    """tiny-dapo composes its run from common.sh and the device script's LAYOUT; selfcheck's real-width model is
    the shipped config; migrate reads the launch script: all from the wheel."""
    w = wheel_env
    r = run(w, sys.executable, "-c", "from mcore_dapo_checks import tiny_dapo as t; from mcore_dapo_checks.cli.selfcheck "
            "import REAL_CONFIG; print(t.SCRIPT.is_file(), len(t.layout_args('a2')), (REAL_CONFIG / 'config.json')"
            ".is_file())")
    assert r.returncode == 0 and r.stdout.split() == ["True", "17", "True"], r.stderr[-2000:]
    # the verification package's commands reach `mcore-dapo` through the wheel's entry point
    r = run(w, "mcore-dapo", "--help")
    assert r.returncode == 0 and all(c in r.stdout for c in ("demo", "selfcheck", "sync-bench", "tiny-dapo")), r.stdout
    (w["away"] / "o.txt").write_text("actor_rollout_ref.actor.strategy=fsdp\ntrainer.nnodes=4\n")
    r = run(w, "mcore-dapo", "migrate", "o.txt", "--device", "a2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[0])["recipe"] == "dapo_qwen3_30b_a2.sh"
