"""mcore-convert: bit-exact round trips under several layouts, cross-layout loading, safety, bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open
from in_process import run_cli

from mcore_dapo.bridge import Layout
from mcore_dapo.io import output
from mcore_dapo.convert.api import hf2mcore, mcore2hf
from mcore_dapo.convert.verify import verify
from mcore_dapo.errors import UserError

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo


def _tensors(folder):
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
        ["model.safetensors"]
    out = {}
    for f in files:
        with safe_open(str(folder / f), framework="pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def assert_bit_exact(a, b):
    ta, tb = _tensors(a), _tensors(b)
    assert sorted(ta) == sorted(tb)
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
        assert torch.equal(ta[k].view(torch.uint8), tb[k].view(torch.uint8)), k


@pytest.fixture(scope="module")
def converted(tiny_moe, tmp_path_factory):
    """``hf2mcore`` of the tiny model under a layout, once for this file: ``(checkpoint, hf2mcore's report)``.
    The tests that take one read it and write elsewhere."""
    done = {}

    def get(layout: Layout):
        if layout.describe() not in done:
            out = tmp_path_factory.mktemp("mcore") / "mcore"
            done[layout.describe()] = (out, hf2mcore(tiny_moe, out, layout, progress=False))
        return done[layout.describe()]
    return get


@pytest.mark.parametrize("layout,nproc_back,dtype", [
    (Layout(tp=2, ep=2), 2, "fp32"),
    (Layout(pp=2, ep=2), 1, "fp32"),
    (Layout(tp=2, ep=2, etp=1), 4, "fp32"),
    (Layout(ep=4), 2, "bf16"),  # a bf16 model's bytes, as the real checkpoint's
], ids=lambda x: x.describe() if isinstance(x, Layout) else (f"back{x}" if isinstance(x, int) else x))
def test_round_trip_is_bit_exact(tiny_moe, converted, tmp_path, layout, nproc_back, dtype):
    if dtype == "bf16":
        from mcore_dapo_checks.tiny import make_tiny_model

        source = make_tiny_model(tmp_path / "bf16", seed=3, dtype="bfloat16")
        m = hf2mcore(source, tmp_path / "mcore", layout, progress=False)
        mcore = tmp_path / "mcore"
    else:
        source = tiny_moe
        mcore, m = converted(layout)
    assert m["tensor_count"] == 135 and m["layout_written"]["ep"] == layout.ep and m["dtype"] == dtype
    r = mcore2hf(mcore, tmp_path / "hf", nproc=nproc_back, progress=False)
    assert r["checked_against_manifest"] and r["checksum_mismatches"] == []
    assert_bit_exact(source, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == \
        json.loads((source / "config.json").read_text())
    assert not list(tmp_path.glob(".*partial*"))


@pytest.fixture(scope="module")
def dense_mcore(tiny_dense, tmp_path_factory):
    """``hf2mcore`` of the dense tiny Qwen3 under TP2, once for this file (its round trip and a does-not-fit case)."""
    out = tmp_path_factory.mktemp("mcore-dense") / "mcore"
    hf2mcore(tiny_dense, out, Layout(tp=2), progress=False)
    return out


def test_dense_model_round_trip(tiny_dense, dense_mcore, tmp_path):
    mcore2hf(dense_mcore, tmp_path / "hf-d", nproc=1, progress=False)
    assert_bit_exact(tiny_dense, tmp_path / "hf-d")


def test_checkpoint_written_under_one_layout_loads_under_others(tiny_moe, converted):
    # (mcore2hf in the round trips above also loads under another layout: TP1/EP=nproc; a per-layer checkpoint
    # loads under PP2·EP2 in the mixed test below; Megatron's own saves under EP2 load under TP2·EP2 and PP2·EP2 in
    # tests/test_resume.py)
    mcore, _ = converted(Layout(tp=2, ep=2))
    r = verify(tiny_moe, mcore, Layout(tp=2, ep=2, etp=1))
    assert r["passed"], r
    assert r["max_abs_diff"] < 1e-4 and r["checksum_mismatches"] == 0
    assert r["key_layout"] == "stacked"


def content_metadata(path):
    """A checkpoint's content metadata; megatron-core 0.12.x neither writes nor reads one (None)."""
    from megatron.core import dist_checkpointing

    load = getattr(dist_checkpointing, "load_content_metadata", None)
    return None if load is None else load(str(path))


def test_checkpoint_keys_are_those_of_the_transformer_engine_spec(converted):
    from mcore_dapo.io.dist_ckpt import checkpoint_keys

    mcore, m = converted(Layout(ep=2))
    keys = checkpoint_keys(mcore)
    # every layer MoE: stacked under one key with a layer axis, as moe_layer_freq=1 models load them
    assert m["key_layout"] == "stacked" and not any(k.startswith("decoder.layers.0.") for k in keys)
    assert keys["decoder.layers.pre_mlp_layernorm.weight"] == (4, 64)
    assert keys["decoder.layers.self_attention.linear_qkv.layer_norm_weight"] == (4, 64)
    assert not any("mlp.linear_fc1.layer_norm" in k for k in keys)
    assert keys["decoder.layers.mlp.experts.experts.linear_fc1.weight"] == (4, 8, 64, 64)
    assert content_metadata(mcore) is None


def test_mixed_dense_and_moe_layers_round_trip_per_layer(tmp_path):
    from megatron.core import dist_checkpointing

    from mcore_dapo_checks.tiny import make_tiny_model
    from mcore_dapo.megatron_compat import accepts
    from mcore_dapo.io.dist_ckpt import checkpoint_keys

    mixed = make_tiny_model(tmp_path / "mixed", seed=5, mlp_only_layers=[0, 2])
    m = hf2mcore(mixed, tmp_path / "mcore", Layout(tp=2, ep=2), progress=False)
    # what Megatron writes for a list moe_layer_freq, recorded for Megatron-LM's loaders where Megatron's
    # save() records content metadata (not 0.12.x: there the per-layer keys alone say it)
    assert m["key_layout"] == "per-layer"
    recorded = accepts(dist_checkpointing.save, "content_metadata")
    assert content_metadata(tmp_path / "mcore") == ({"non_homogeneous_layers": True} if recorded else None)
    keys = checkpoint_keys(tmp_path / "mcore")
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in keys  # dense: norm fused as in TE
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys
    r = mcore2hf(tmp_path / "mcore", tmp_path / "hf", nproc=2, progress=False)
    assert r["key_layout"] == "per-layer" and r["checksum_mismatches"] == []
    assert_bit_exact(mixed, tmp_path / "hf")
    v = verify(mixed, tmp_path / "mcore", Layout(pp=2, ep=2))
    assert v["passed"] and v["key_layout"] == "per-layer" and v["max_abs_diff"] < 1e-4, v


@pytest.mark.parametrize("source,message", [
    ({"num_hidden_layers": 3},
     "(4 layers, stacked keys expected): key 'decoder.layers.self_attention.linear_qkv.layer_norm_weight' "
     "has shape [3, 64] in the checkpoint, [4, 64] in the model"),
    (None, "(4 layers, stacked keys expected): key 'decoder.layers.pre_mlp_layernorm.weight' is missing"),
], ids=["layer-count", "dense-keys"])  # dense-keys: the dense tiny Qwen3's checkpoint (dense_mcore)
def test_checkpoint_that_does_not_fit_the_config_is_one_line_and_writes_nothing(request, tiny_moe, tmp_path, source,
                                                                                message):
    from mcore_dapo_checks.tiny import make_tiny_model

    if source is None:
        mcore = request.getfixturevalue("dense_mcore")
    else:
        mcore = tmp_path / "mcore"
        hf2mcore(make_tiny_model(tmp_path / "other", seed=2, **source), mcore, Layout(ep=1), progress=False)
    r = _cli("mcore2hf", "--mcore-path", mcore, "--hf-config", tiny_moe, "--out", tmp_path / "hf", "--nproc", "2",
             "--json")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"error: torch_dist checkpoint '{mcore}' does not fit the model " + message, r.stderr
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.partial*"))


def test_verify_fails_on_a_different_checkpoint(tiny_moe, converted, tmp_path):
    from mcore_dapo_checks.tiny import make_tiny_model

    mcore, _ = converted(Layout(ep=2))
    other = make_tiny_model(tmp_path / "other", seed=7)
    shutil.copy(tiny_moe / "config.json", other / "config.json")
    out = _cli("verify", "--hf-path", other, "--mcore-path", mcore, "--json")
    assert out.returncode == 1, out.stderr
    r = json.loads(out.stdout)
    assert not r["passed"] and r["checksum_mismatches"] == 135 and r["max_abs_diff"] > 1e-2


def _cli(*args):
    """``mcore-convert args``: the console script's function (``mcore_dapo.cli.convert:main``) in this process
    (tests/in_process.py; the console script in a process of its own:
    test_interrupted_conversion_leaves_no_finished_checkpoint)."""
    from mcore_dapo.cli.convert import main

    return run_cli(main, *args)


def test_existing_output_is_refused_unless_overwrite(tiny_moe, tmp_path):
    out = tmp_path / "mcore"
    out.mkdir()
    (out / "keep").write_text("x")
    r = _cli("hf2mcore", "--hf-path", tiny_moe, "--out", out, "--ep", "2")
    assert r.returncode == 2 and r.stderr.strip() == f"error: output '{out}' already exists: pass --overwrite to replace it"
    assert (out / "keep").exists()
    r = _cli("hf2mcore", "--hf-path", tiny_moe, "--out", out, "--ep", "2", "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    assert (out / output.MANIFEST).is_file() and not (out / "keep").exists()


def test_interrupted_conversion_leaves_no_finished_checkpoint(tiny_moe, tmp_path):
    out = tmp_path / "mcore"
    p = subprocess.Popen([sys.executable, "-m", "mcore_dapo.cli.convert", "hf2mcore", "--hf-path", str(tiny_moe),
                          "--out", str(out), "--ep", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".mcore.partial-*")) and time.time() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".mcore.partial-*")), "the conversion never started writing"
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not out.exists()
    with pytest.raises(UserError, match="no mcore_dapo_manifest.json"):
        output.read_manifest(next(tmp_path.glob(".mcore.partial-*")))


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage,message", [
    ("missing_shard", "shard 'model-00002-of-00002.safetensors' named in model.safetensors.index.json is missing"),
    ("truncated", "is truncated"),
    ("shape", "gate_proj.weight' has shape [32, 64] in the checkpoint, config.json implies [16, 64]"),
    ("arch", "model_type='llama' is not supported"),
    ("missing_tensor", "tensor 'lm_head.weight' that config.json implies is missing"),
])
def test_bad_checkpoints_get_one_line_errors_and_leave_nothing(tiny_moe, tmp_path, damage, message):
    hf = _copy(tiny_moe, tmp_path / "hf")
    if damage == "missing_shard":
        from safetensors.torch import save_file

        t = _tensors(hf)
        names = sorted(t)
        halves = {"model-00001-of-00002.safetensors": names[:50], "model-00002-of-00002.safetensors": names[50:]}
        for fname, part in halves.items():
            save_file({k: t[k] for k in part}, str(hf / fname))
        (hf / "model.safetensors").unlink()
        index = {"weight_map": {k: f for f, part in halves.items() for k in part}}
        (hf / "model.safetensors.index.json").write_text(json.dumps(index))
        (hf / "model-00002-of-00002.safetensors").unlink()
    elif damage == "truncated":
        f = hf / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-1000])
    elif damage == "shape":
        cfg = json.loads((hf / "config.json").read_text())
        cfg["moe_intermediate_size"] = 16
        (hf / "config.json").write_text(json.dumps(cfg))
    elif damage == "arch":
        cfg = json.loads((hf / "config.json").read_text())
        cfg["model_type"] = "llama"
        (hf / "config.json").write_text(json.dumps(cfg))
    elif damage == "missing_tensor":
        from safetensors.torch import save_file

        t = _tensors(hf)
        del t["lm_head.weight"]
        save_file(t, str(hf / "model.safetensors"))
    r = _cli("hf2mcore", "--hf-path", hf, "--out", tmp_path / "out", "--ep", "2")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial*"))


@pytest.mark.parametrize("args,message", [
    (["--ep", "3"], "ep=3 does not divide the 8 experts"),
    (["--tp", "8"], "tp=8 does not divide the 4 KV groups"),
    (["--tp", "2", "--nproc", "3"], "world size 3 is not divisible by TP*PP*CP = 2"),
])
def test_bad_layouts(tiny_moe, tmp_path, args, message):
    r = _cli("hf2mcore", "--hf-path", tiny_moe, "--out", tmp_path / "out", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_unwritable_output(tiny_moe, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = _cli("hf2mcore", "--hf-path", tiny_moe, "--out", blocker / "ckpt")
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = _cli("mcore2hf", "--mcore-path", tmp_path / "nothing", "--out", tmp_path / "hf")
    assert r.returncode == 2 and "does not exist" in r.stderr
