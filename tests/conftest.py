"""Shared fixtures: tiny generated models and their HF reference logits (computed in a clean process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


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
