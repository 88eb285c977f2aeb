"""The two Megatron lines together: torch_dist checkpoints written under one load under the other, bit-exact both
ways, on a shape no other test uses (the converters' round trip on the Ascend line).

The test runs the other stack's environment in a subprocess (``.venv`` for the main stack, ``.venv-ascend`` for the
Ascend line: `make setup` / `make setup STACK=ascend` build them; `.ci/run` builds the main one first). It is in the
Ascend stack's selection (`ascend_stack`): the main stack runs every other converter test.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcore_dapo import versions
from mcore_dapo.bridge import Layout
from mcore_dapo.convert.api import hf2mcore, mcore2hf
from mcore_dapo.convert.verify import verify
from mcore_dapo.io import output

from test_convert import assert_bit_exact

pytestmark = [pytest.mark.cpu_only, pytest.mark.ascend_stack]

REPO = Path(__file__).resolve().parent.parent

# hidden 96, 6 query heads in 2 KV groups of head_dim 32, 6 experts top-3 of ffn 48, 3 layers with a
# dense middle one (per-layer keys), vocab 320, tied embeddings: no other test builds this shape
UNSEEN = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=32, num_experts=6,
              num_experts_per_tok=3, moe_intermediate_size=48, intermediate_size=80, num_hidden_layers=3,
              mlp_only_layers=[1], vocab_size=320, tie_word_embeddings=True)


def _other_stack() -> tuple[str, Path]:
    """(name, python) of the stack this process is not."""
    name, venv = (("main", ".venv") if versions.megatron_version() < (0, 16, 0) else ("ascend", ".venv-ascend"))
    python = REPO / venv / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the {name} stack's environment {venv} does not exist: make setup STACK={name}")
    return name, python


def _convert_there(python: Path, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([str(python), "-m", "mcore_dapo.cli.convert", *args], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def test_checkpoints_cross_between_the_megatron_lines_on_an_unseen_shape(tmp_path):
    from mcore_dapo_checks.tiny import make_tiny_model

    name, there = _other_stack()
    here = versions.installed("megatron-core")
    hf = make_tiny_model(tmp_path / "unseen", seed=11, **UNSEEN)
    # written there under TP2·EP2, read here under TP1·EP3 and verified here under PP3
    _convert_there(there, "hf2mcore", "--hf-path", str(hf), "--out", str(tmp_path / "there"),
                   "--tp", "2", "--ep", "2", "--nproc", "4")
    m = output.read_manifest(tmp_path / "there")
    assert m["written_by"]["megatron-core"] != here and m["key_layout"] == "per-layer", m
    r = mcore2hf(tmp_path / "there", tmp_path / "hf-here", nproc=3, progress=False)
    assert r["checked_against_manifest"] and r["checksum_mismatches"] == []
    assert_bit_exact(hf, tmp_path / "hf-here")
    v = verify(hf, tmp_path / "there", Layout(pp=3, ep=1), nproc=3)
    assert v["passed"] and v["max_abs_diff"] < 1e-4 and v["checksum_mismatches"] == 0, v
    # written here under PP3 (one layer a stage, the dense one alone), read there under TP1·EP2
    w = hf2mcore(hf, tmp_path / "here", Layout(pp=3), progress=False)
    assert w["written_by"]["megatron-core"] == here and w["key_layout"] == "per-layer"
    _convert_there(there, "mcore2hf", "--mcore-path", str(tmp_path / "here"), "--out", str(tmp_path / "hf-there"),
                   "--nproc", "2")
    assert_bit_exact(hf, tmp_path / "hf-there")
