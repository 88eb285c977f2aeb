"""Shared fixtures: tiny generated models and their HF reference logits (computed in a clean process).

Tests say where they run: those marked ``cpu_only`` need this project's CPU path (the CPU patches of
Megatron, verl's ``cpu`` platform); on a CUDA or Ascend node they are skipped with the detected device
named. Those marked ``ranks(n)`` start n torchrun ranks that go through the device adapter alone (the
host's device, its backend and layer spec): they run on an accelerator host with n devices visible
(one a rank) and are skipped with the count named where fewer are. The rest of the suite runs there
unchanged; the accelerator's whole check is ``mcore-dapo selfcheck --device``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# The Ascend stack's selection (`make test STACK=ascend`: torch 2.7.1, megatron-core 0.12.1), kept within
# about 20 minutes on a 2-core CPU: Megatron vs HF in every layout class, the converters, resharding,
# verl's engine and trainer, the patch registry and the bridge. A test id here is a prefix of pytest's
# node id (a file, a test, or one parametrisation); a file may mark parameters `both_stacks` itself. Tests marked
# `ascend_stack` run in that stack only.
BOTH_STACKS = (
    "tests/test_bridge_config.py",
    "tests/test_mapping.py",
    "tests/test_layout.py",
    "tests/test_patches.py",
    "tests/test_distributed_optimizer.py",
    "tests/test_async_save.py",  # megatron-core 0.12.1's AsyncRequest and persistent worker
    "tests/test_devices.py",
    "tests/test_versions.py",
    "tests/test_verl_plugin.py",
    "tests/test_megatron_vs_hf.py::test_moe_layouts_match_hf[2---ep-2-alltoall+allgather]",
    # (TP2·EP2·ETP1 with sequence parallelism: tests/test_verl_trainer.py's run, every update against the HF model)
    "tests/test_megatron_vs_hf.py::test_moe_layouts_match_hf[4---tp-2---ep-2---etp-2-alltoall+allgather]",
    "tests/test_megatron_vs_hf.py::test_moe_layouts_match_hf[4---pp-2---ep-2-alltoall+allgather]",
    "tests/test_megatron_vs_hf.py::test_dense_qwen3_tp2",
    "tests/test_megatron_vs_hf.py::test_pp2_vpp2_uneven_stages_match_hf",
    # (round trips on this line: tests/test_stack_lines.py, TP2·EP2 and PP3 across the lines on an unseen shape)
    "tests/test_convert.py::test_checkpoint_keys_are_those_of_the_transformer_engine_spec",
    "tests/test_convert.py::test_checkpoint_that_does_not_fit_the_config_is_one_line_and_writes_nothing[layer-count]",
    # (resharding: its layout classes whose Megatron modules differ, marked `both_stacks` in tests/test_resharding.py)
    "tests/test_verl_engine.py",
    "tests/test_verl_trainer.py",
    "tests/test_mindspeed.py",  # the real MindSpeed 26.1.0_core_r0.12.1 needs the 0.12.1 line (skipped on main)
    "tests/test_a2_recipe.py",
    "tests/test_fast_paths.py::test_te_grouped_mlp_parameters_and_checkpoint_keys_match_the_bridge",  # 0.12.1's sources
    "tests/test_fast_paths.py::test_ascend_turns_on_mindspeeds_flags_where_their_conditions_hold",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_only: needs the CPU device path (gloo ranks on one host, the CPU "
                            "patches of Megatron, verl's cpu platform)")
    config.addinivalue_line("markers", "no_accelerator: asserts what this host lacks (no torch_npu, no Transformer "
                            "Engine, no CUDA or NPU device): skipped on a CUDA or Ascend host")
    config.addinivalue_line("markers", "ranks(n): n torchrun ranks through the device adapter alone (no CPU "
                            "patch): on an accelerator host, one device a rank, skipped where fewer are visible")
    config.addinivalue_line("markers", "both_stacks: in the Ascend stack's selection too (BOTH_STACKS)")
    config.addinivalue_line("markers", "ascend_stack: runs in the Ascend stack's selection only (make test "
                            "STACK=ascend)")
    config.addinivalue_line("markers", "main_stack_only: left out of the Ascend stack's selection although "
                            "BOTH_STACKS names its file (what it proves does not depend on the Megatron line)")
    _start_ranks_by_fork()


# LAUNCHES. On the CPU the suite's torchrun launches (mcore_dapo.runtime.launch.run_torchrun) start their ranks by
# forking a server that imported torch, Megatron and transformers once (mcore_dapo_checks.rank_server), with what
# torchrun gives a rank; most of a launch was each rank importing them (docs/TESTING.md, "Launches").
# MCORE_DAPO_TESTS_TORCHRUN=1 launches every one with torchrun. On a device the ranks start as users start them.
_RANK_SERVER = None


def _start_ranks_by_fork() -> None:
    global _RANK_SERVER
    import os

    from mcore_dapo.devices import detect
    from mcore_dapo.runtime import launch

    if os.environ.get("MCORE_DAPO_TESTS_TORCHRUN") == "1" or detect() != "cpu":
        return
    from mcore_dapo_checks.rank_server import RankServer

    _RANK_SERVER = launch.STARTER = RankServer()


def pytest_unconfigure(config):
    global _RANK_SERVER
    if _RANK_SERVER is not None:
        from mcore_dapo.runtime import launch

        _RANK_SERVER.close()
        launch.STARTER = _RANK_SERVER = None


# WORKER GROUPS. `make test` runs two pytest workers (pytest-xdist): the files that start torchrun ranks, Ray or vLLM
# leave part of the two cores idle while processes start and ranks wait on each other, and the other worker fills
# it. A file's tests stay on one worker, where its module fixtures run once; the two files that share the trainer
# runs (the session fixture dapo_trainer_run) are one group. Groups start in the order below, the longest first (the
# suite's time per file, docs/BENCHMARKS.md), so that the last to finish is a short one; the files not named follow
# in pytest's order. (xdist 3.8.0's own --dist loadgroup marks a group by rewriting item._nodeid, xdist/remote.py
# pytest_collection_modifyitems, which pytest 9.2's Node.nodeid no longer reads, _pytest/nodes.py returns
# str(self._id); the scheduler below groups by file itself.)
SHARED_GROUPS = {"tests/test_resume.py": "trainer-runs", "tests/test_verl_trainer.py": "trainer-runs"}
LONGEST_FIRST = (
    "tests/test_resume.py", "tests/test_verl_trainer.py", "tests/test_convert.py", "tests/test_verl_plugin.py",
    "tests/test_stack_lines.py", "tests/test_megatron_vs_hf.py", "tests/test_foreign_loader.py",
    "tests/test_resharding.py", "tests/test_selfcheck.py", "tests/test_migrate.py", "tests/test_verl_engine.py",
    "tests/test_verl061.py", "tests/test_vllm_rollout.py", "tests/test_plan_megatron.py",
)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def worker_group(nodeid: str) -> str:
    return SHARED_GROUPS.get(file_of(nodeid), file_of(nodeid))


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkerGroup(LoadScopeScheduling):
        """xdist's scope scheduling (a scope's tests on one worker, scopes handed out in the collection's order,
        the next one to a worker that is almost done) with worker_group as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False  # the collection's order: LONGEST_FIRST's, not the most tests first
    return ByWorkerGroup(config, log)


def pytest_collection_modifyitems(config, items):
    from mcore_dapo.devices import detect

    for item in items:
        if item.nodeid.startswith(BOTH_STACKS) and item.get_closest_marker("main_stack_only") is None:
            item.add_marker(pytest.mark.both_stacks)
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(file_of(item.nodeid), len(LONGEST_FIRST)))  # stable
    device = detect()
    if device == "cpu":
        return
    from mcore_dapo.devices import get_adapter

    skip = pytest.mark.skip(reason=f"cpu_only: this host's device is {device}")
    visible = get_adapter(device).device_count() or 0
    for item in items:
        if "cpu_only" in item.keywords:
            item.add_marker(skip)
        elif "no_accelerator" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"no_accelerator: this host's device is {device}"))
        elif (m := item.get_closest_marker("ranks")) is not None and m.args[0] > visible:
            item.add_marker(pytest.mark.skip(reason=f"{m.args[0]} ranks need {m.args[0]} {device} devices, "
                                                    f"{visible} visible"))


def _reference(hf_dir: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "mcore_dapo_checks.tiny", "reference", str(hf_dir), str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    from mcore_dapo_checks.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-moe", seed=0)


@pytest.fixture(scope="session")
def tiny_moe_ref(tiny_moe, tmp_path_factory) -> Path:
    return _reference(tiny_moe, tmp_path_factory.mktemp("ref") / "ref.pt")


@pytest.fixture(scope="session")
def tiny_dense(tmp_path_factory) -> Path:
    from mcore_dapo_checks.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", seed=1, model_type="qwen3")


@pytest.fixture(scope="session")
def tiny_dense_ref(tiny_dense, tmp_path_factory) -> Path:
    return _reference(tiny_dense, tmp_path_factory.mktemp("ref") / "ref-dense.pt")


@pytest.fixture(scope="session")
def reference_config() -> Path:
    """The Hugging Face config.json of Qwen3-30B-A3B (shipped in configs/models)."""
    return REPO / "configs" / "models" / "qwen3-30b-a3b" / "config.json"


@pytest.fixture(scope="session")
def dapo_trainer_run(request, tmp_path_factory):
    """verl's trainer with the launch scripts' settings, 4 steps (:func:`mcore_dapo_checks.resume.trainer_run`):
    what tests/test_verl_trainer.py checks. Where tests/test_resume.py is selected too (the main stack), those 4
    steps are the killed run's 1 and 2 and the resumed run's 3 and 4 (:func:`mcore_dapo_checks.resume.four_steps`,
    the audit the reference chained across the kill; its ``pair`` is what test_resume.py checks): one pair of runs
    for both files, where an uninterrupted run beside them would train the same steps a third time. Elsewhere one
    uninterrupted run. Either way a dict: ``metrics`` (per step), ``audit``, ``work``, ``returncode``, ``error``,
    ``log_tail``, ``pair`` (None for the uninterrupted run)."""
    from mcore_dapo_checks import resume
    from mcore_dapo_checks.tiny_dapo import log_tail, read_metrics, run

    work = tmp_path_factory.mktemp("tiny-dapo")
    if any(item.nodeid.startswith("tests/test_resume.py") for item in request.session.items):
        return resume.four_steps(work, timeout=1200)
    result = run(work, timeout=1200, **resume.trainer_run())
    return {"work": work, "pair": None, "returncode": result["returncode"], "error": result["error"],
            "metrics": [r["data"] for r in read_metrics(work / "metrics.jsonl")] if result["returncode"] == 0 else [],
            "audit": result.get("audit"),
            "log_tail": log_tail(work / "train.log")}
