"""Shared fixtures: tiny generated models and their HF reference logits (computed in a clean process).

Tests say where they run: those marked ``cpu_only`` need this project's CPU path (several ranks of
real Megatron on one host under gloo, the CPU patches of Megatron, verl's ``cpu`` platform); on a
CUDA or Ascend node they are skipped with the detected device named, and the rest of the suite runs
there unchanged (the accelerator's own checks are ``mcore-dapo`` commands with ``--device``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_only: needs the CPU device path (gloo ranks on one host, the CPU "
                            "patches of Megatron, verl's cpu platform)")


def pytest_collection_modifyitems(config, items):
    from mcore_dapo.devices import detect

    device = detect()
    if device == "cpu":
        return
    skip = pytest.mark.skip(reason=f"cpu_only: this host's device is {device}")
    for item in items:
        if "cpu_only" in item.keywords:
            item.add_marker(skip)


def _reference(hf_dir: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "mcore_dapo.harness.tiny", "reference", str(hf_dir), str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory) -> Path:
    from mcore_dapo.harness.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-moe", seed=0)


@pytest.fixture(scope="session")
def tiny_moe_ref(tiny_moe, tmp_path_factory) -> Path:
    return _reference(tiny_moe, tmp_path_factory.mktemp("ref") / "ref.pt")


@pytest.fixture(scope="session")
def tiny_dense(tmp_path_factory) -> Path:
    from mcore_dapo.harness.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", seed=1, model_type="qwen3")


@pytest.fixture(scope="session")
def tiny_dense_ref(tiny_dense, tmp_path_factory) -> Path:
    return _reference(tiny_dense, tmp_path_factory.mktemp("ref") / "ref-dense.pt")


@pytest.fixture(scope="session")
def reference_config() -> Path:
    """The Hugging Face config.json of Qwen3-30B-A3B (shipped in configs/models)."""
    return REPO / "configs" / "models" / "qwen3-30b-a3b" / "config.json"
