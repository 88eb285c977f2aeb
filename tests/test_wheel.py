"""The package as a cluster image installs it: its wheel, built from this tree, installed without the checkout on
the path, run from another folder. The launch scripts, ``configs/dapo/common.sh`` and the model's config are in
the wheel (``mcore_dapo/_configs``) and every command finds them there.

The wheel is installed into a fresh virtual environment (no system site-packages) and run with its interpreter
and its console scripts. This environment's dependencies (torch, megatron-core, verl) reach it through a ``.pth``
file naming this environment's site-packages folders as plain path lines: Python adds such a line to ``sys.path``
without processing the ``.pth`` files inside it, so the editable install's ``.pth`` (which puts the checkout on
the path) is not read. The test asserts that the checkout is not on that interpreter's path and that both packages,
``mcore_dapo`` and ``mcore_dapo_checks``, come from the fresh environment: a package left out of the wheel cannot
be found (mutation: ``mcore_dapo_checks`` taken out of pyproject.toml's wheel packages failed it).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    dist, venv, away = base / "dist", base / "venv", base / "elsewhere"
    away.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    r = subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dist), str(REPO)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next(dist.glob("mcore_dapo-*.whl"))
    # a fresh environment: the base interpreter, no system site-packages, no pip of its own (this one's installs)
    r = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    python = venv / "bin" / "python"
    r = subprocess.run([*pip, "--python", str(python), "install", "--no-deps", str(wheel)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # this environment's dependencies as plain path lines, after the fresh environment's own site-packages
    deps = [p for p in dict.fromkeys([*site.getsitepackages(), sysconfig.get_path("purelib")]) if Path(p).is_dir()]
    (purelib / "zz_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MCORE_DAPO_MODEL_CONFIG")}
    env.update(PATH=os.pathsep.join([str(venv / "bin"), env["PATH"]]))  # the wheel's console scripts first
    return {"venv": venv, "purelib": purelib, "python": str(python), "away": away, "env": env, "wheel": wheel}


def run(w, *args, **kw):
    return subprocess.run(list(args), cwd=w["away"], env={**w["env"], **kw}, capture_output=True, text=True,
                          timeout=300)


def test_the_interpreter_cannot_see_the_checkout(wheel_env):
    """What the other tests run is the wheel: the checkout is on no path of the fresh interpreter, and both
    packages come from the fresh environment's site-packages."""
    w = wheel_env
    r = run(w, w["python"], "-c", "import json, sys, mcore_dapo, mcore_dapo_checks; print(json.dumps({'path': "
            "sys.path, 'files': [mcore_dapo.__file__, mcore_dapo_checks.__file__]}))")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    seen = [Path(p or w["away"]).resolve() for p in out["path"]]
    assert REPO not in seen, out["path"]
    # the packages are found in the fresh environment and on no other path entry
    holders = [p for p in seen if any((p / n / "__init__.py").is_file() for n in ("mcore_dapo", "mcore_dapo_checks"))]
    assert holders == [w["purelib"].resolve()], holders
    assert all(Path(f).resolve().is_relative_to(w["purelib"].resolve()) for f in out["files"]), out
    r = run(w, "head", "-1", str(w["venv"] / "bin" / "mcore-dapo"))
    assert r.stdout.strip() == f"#!{w['python']}", r.stdout  # the console script runs the fresh interpreter


def test_the_package_comes_from_the_wheel_with_its_files(wheel_env):
    w = wheel_env
    r = run(w, w["python"], "-c", "import mcore_dapo, mcore_dapo.resources as r; print(mcore_dapo.__file__); "
            "print(r.configs_dir()); print(r.model_config())")
    assert r.returncode == 0, r.stderr
    module, configs, model = r.stdout.split()
    assert Path(module).is_relative_to(w["purelib"]) and Path(configs) == w["purelib"] / "mcore_dapo" / "_configs"
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
    r = run(w, w["python"], "-c", "from mcore_dapo_checks import tiny_dapo as t; from mcore_dapo_checks.cli.selfcheck "
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
