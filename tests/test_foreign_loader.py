"""Converted checkpoints in a model configured by verl's own code, not this project's bridge.

``mcore_dapo_checks.foreign_loader`` builds the model from verl 0.9.1's
``hf_to_mcore_config_qwen3moe`` (``moe_layer_freq`` at its default, as Megatron-LM's recipes and
MindSpeed-LLM also leave it) and verl's ``Qwen3MoEModel`` initializer, and loads through verl's
``load_mcore_dist_weights``; what it changes for the CPU is listed in its ``CPU_OVERRIDES``
(no CUDA kernels, SequentialMLP experts) and its layer spec is the CPU adapter's, with the
Transformer Engine spec's checkpoint keys. The proof: ``pytest tests/test_foreign_loader.py``.
"""

import pytest

from mcore_dapo.bridge import Layout
from mcore_dapo.convert.api import hf2mcore, mcore2hf
from mcore_dapo.runtime.launch import torchrun
from test_convert import assert_bit_exact

pytest.importorskip("verl")

pytestmark = pytest.mark.cpu_only  # the worker runs the CPU adapter (gloo) whatever the host

TOL = 1e-4  # fp32


def foreign(hf, *args, nproc=2):
    return torchrun("mcore_dapo_checks.foreign_loader", ["--hf-path", str(hf), *map(str, args)], nproc,
                    timeout=600)


@pytest.fixture(scope="module")
def converted(tiny_moe, tmp_path_factory):
    """``mcore-convert hf2mcore`` output, written under TP2 EP2 (the layout of the report)."""
    out = tmp_path_factory.mktemp("foreign") / "mcore"
    m = hf2mcore(tiny_moe, out, Layout(tp=2, ep=2), progress=False)
    assert m["key_layout"] == "stacked" and m["dtype"] == "fp32"
    return out


@pytest.fixture(scope="module")
def per_layer(tiny_moe, tmp_path_factory):
    """A checkpoint with one key per layer, as this project's earlier versions wrote (list moe_layer_freq)."""
    out = tmp_path_factory.mktemp("per-layer") / "mcore"
    r = foreign(tiny_moe, "--per-layer", "--save", out, "--ep", 2)
    assert r["moe_layer_freq"] == [1, 1, 1, 1] and r["saved_key_layout"] == "per-layer"
    return out


@pytest.mark.parametrize("layout", [["--ep", 2], ["--tp", 2]], ids=["EP2", "TP2"])
def test_verl_configured_model_loads_our_checkpoint_and_gives_hf_logits(tiny_moe, tiny_moe_ref, converted, layout):
    r = foreign(tiny_moe, "--load", converted, "--reference", tiny_moe_ref, *layout)
    assert r["moe_layer_freq"] == 1 and r["loaded_from"] == "checkpoint"
    assert r["max_abs_diff"] < TOL, r


def test_checkpoint_saved_by_verl_configured_model_converts_back_bit_exact(tiny_moe, converted, tmp_path):
    r = foreign(tiny_moe, "--load", converted, "--save", tmp_path / "saved", "--tp", 2)
    assert r["saved_key_layout"] == "stacked"
    back = mcore2hf(tmp_path / "saved", tmp_path / "hf", hf_config=tiny_moe, nproc=2, progress=False)
    assert back["key_layout"] == "stacked" and back["tensors"] == 135 and not back["checked_against_manifest"]
    assert_bit_exact(tiny_moe, tmp_path / "hf")


def test_per_layer_checkpoint_of_earlier_versions_converts_back_bit_exact(tiny_moe, per_layer, tmp_path):
    r = mcore2hf(per_layer, tmp_path / "hf", hf_config=tiny_moe, nproc=2, progress=False)
    assert r["key_layout"] == "per-layer"
    assert_bit_exact(tiny_moe, tmp_path / "hf")


def test_per_layer_checkpoint_loads_for_verify(tiny_moe, tiny_moe_ref, per_layer):
    # the worker `mcore-convert verify` runs, under another layout than the one that wrote it
    r = torchrun("mcore_dapo_checks.logits", ["--hf-path", str(tiny_moe), "--reference", str(tiny_moe_ref),
                                               "--mcore-path", str(per_layer), "--tp", "2"], 2, timeout=600)
    assert r["key_layout"] == "per-layer" and r["max_abs_diff"] < TOL, r


def test_stock_model_refuses_per_layer_keys(tiny_moe, per_layer):
    # why the layout matters: the error users of the earlier versions met
    r = foreign(tiny_moe, "--load", per_layer, "--ep", 2)
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in r["load_error"], r
