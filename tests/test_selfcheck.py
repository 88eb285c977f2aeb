"""mcore-dapo selfcheck: the whole check on the CPU (tiny model, 2 processes), budgets, missing devices, bad input."""

import importlib.util
import json

import pytest
from in_process import run_cli

from mcore_dapo_checks.cli.selfcheck import STEPS


def selfcheck(*args):
    """``mcore-dapo selfcheck ARGS --json``: the console script's function in this process (tests/in_process.py)."""
    from mcore_dapo.cli.main import main

    return run_cli(main, "selfcheck", *args, "--json")


@pytest.mark.cpu_only
def test_every_step_on_the_cpu(tmp_path):
    p = selfcheck("--device", "cpu", "--nproc", "2", "--workdir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == list(STEPS) and report["ok"] and report["layout"] == "TP1 PP1 EP2 ETP1"
    for name in ("env", "model", "megatron_vs_hf", "convert_roundtrip", "export", "dapo_update"):
        assert steps[name]["verdict"] == "pass", steps[name]
    mvh = steps["megatron_vs_hf"]["result"]
    assert mvh["max_abs_diff"] < 1e-4 and mvh["grad_max_rel_err"] < 1e-4 and mvh["loss_rel_diff"] < 2e-6, mvh
    assert mvh["grads_compared"] == mvh["grads_reference"] > 0
    assert steps["convert_roundtrip"]["result"]["bit_exact"] and steps["export"]["result"]["bit_exact"]
    update = steps["dapo_update"]["result"]
    assert update["received_vs_engine"] == 0.0 and update["planner_allocated_gib"] > 0
    # the update against the fp32 HF reference of the same batch (bf16 engine, tests/test_verl_engine.py's bounds)
    assert update["loss_rel_diff"] < 2e-2 and update["grad_norm_rel_diff"] < 1e-2, update
    assert update["bf16_beyond_one_step"] < 0.05, update
    sync = steps["rollout_sync"]
    if importlib.util.find_spec("vllm") is None:
        assert sync["verdict"] == "skipped" and sync["reason"].startswith("vllm is not installed"), sync
    else:  # vLLM's CPU build: the exporter's stream through verl's ServerAdapter into the engine
        assert sync["verdict"] == "pass", sync
        assert sync["result"]["exact"] and sync["result"]["engine_params"] > 0
        assert sync["result"]["logprob_max_diff"] < 1e-4 and sync["result"]["layout"] == "TP1 PP1 EP2 ETP1"
        # the engine's decode steps timed at the three batch sizes (a step of the tiny model on the CPU: milliseconds)
        steps = sync["result"]["decode_step_ms"]
        assert list(steps) == ["1", "8", "32"] and all(0 < ms < 10_000 for ms in steps.values()), steps
    md = (tmp_path / "selfcheck.md").read_text().splitlines()
    assert all(line.count("|") == 5 for line in md[2:]), md  # a figure with "|" would break the table
    if sync["verdict"] == "pass":
        assert any(line.startswith("| rollout_sync | pass |") for line in md)
    assert json.loads((tmp_path / "selfcheck.json").read_text())["steps"] == report["steps"]
    assert "| megatron_vs_hf | pass |" in (tmp_path / "selfcheck.md").read_text()


def test_a_budget_too_small_skips_steps_with_a_reason(tmp_path):
    p = selfcheck("--device", "cpu", "--workdir", str(tmp_path), "--budget-s", "1")
    assert p.returncode == 0, p.stderr[-2000:]
    steps = json.loads(p.stdout)["steps"]
    assert steps[0]["verdict"] == "pass"
    assert all(s["verdict"] == "skipped" and s["reason"].startswith("budget:") for s in steps[1:])


@pytest.mark.cpu_only
def test_a_missing_device_is_skipped_not_failed(tmp_path):
    p = selfcheck("--device", "cuda", "--workdir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    steps = {s["name"]: s for s in json.loads(p.stdout)["steps"]}
    assert steps["model"]["reason"] == "no cuda device on this machine"
    assert all(s["verdict"] == "skipped" for n, s in steps.items() if n != "env")


def test_bad_input_is_one_line(tmp_path):
    p = selfcheck("--device", "cpu", "--nproc", "0", "--workdir", str(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == "error: nproc=0 is not accepted: a positive integer is"
