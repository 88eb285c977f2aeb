"""Command-line behaviour: env report, and one-line errors without tracebacks for user mistakes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args):
    return subprocess.run([sys.executable, "-m", "mcore_dapo.cli.main", *args], capture_output=True, text=True)


@pytest.mark.cpu_only
def test_env_json_lists_versions_and_patches():
    out = cli("env", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["device"] == "cpu" and info["communication_backend"] == "gloo"
    for pkg in ("torch", "megatron-core", "transformers", "verl", "mindspeed", "torch_npu", "vllm",
                "vllm-ascend", "transformer-engine", "apex"):
        assert pkg in info["versions"]
    assert info["versions"]["megatron-core"] == "0.16.1"
    assert info["versions"]["torch_npu"] == "absent"
    ids = {p["id"] for p in info["patches"]}
    assert "cpu.megatron.torch-cuda-namespace" in ids
    # what does not apply is another stack's (megatron-core 0.12.1, torch 2.7.1), and says so
    # (and vLLM's CPU build's where it is not installed)
    idle = {p["id"]: p["why_not"] for p in info["patches"] if not p["applies"]}
    other_stack = {"megatron.numpy2-product", "cpu.megatron.schedule-token-counter", "cpu.torch.gloo-average",
                   "cpu.megatron.quantize-param-shard-without-te"}
    assert other_stack <= set(idle), idle
    assert all("is outside" in why for i, why in idle.items() if i in other_stack), idle
    assert all(i.startswith("vllm-cpu.") and info["versions"]["vllm"] == "absent" for i in set(idle) - other_stack), idle


def test_env_for_another_device_lists_its_patches():
    out = cli("env", "--json", "--device", "cuda")
    # the router fix for a CUDA node without Transformer Engine (left alone where TE defines the gemm),
    # numpy 2's np.product for megatron-core before 0.16, verl 0.9.1's separate_async log call and the storage guard
    # of weight syncs into vLLM (every device)
    assert out.returncode == 0, out.stderr
    patches = {p["id"]: p["applies"] for p in json.loads(out.stdout)["patches"]}
    assert set(patches) == {"megatron.router-gemm-without-te", "megatron.numpy2-product", "verl.any.separate-async-logger",
                            "verl.any.rollout-storage-guard"}


@pytest.mark.parametrize("args,message", [
    (["env", "--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_argparse_errors(args, message):
    out = cli(*args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_user_error_is_one_line(capsys):
    from mcore_dapo.cli import user_errors
    from mcore_dapo.errors import UserError

    @user_errors
    def f():
        raise UserError("tp=8 does not divide the 4 KV groups")

    assert f() == 2
    got = capsys.readouterr()
    assert got.err == "error: tp=8 does not divide the 4 KV groups\n" and got.out == ""
    # the real command line, with a value the library (not argparse) refuses
    model = Path(__file__).resolve().parents[1] / "configs" / "models" / "qwen3-30b-a3b"
    out = cli("plan", "--model", str(model), "--nodes", "1", "--devices-per-node", "8",
              "--device", "tpu9")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["error: device='tpu9' is not known: accepted are h100, h200, a100, a2 "
                                       "(aliases: 910b, ascend910b, h100-sxm, h200-sxm)"], out.stderr
