"""The A2 recipe's stack (docs/ASCEND.md) as `mcore-dapo env --device npu` reports it, and the one-line
refusal of verl versions the plugin cannot serve (verl 0.6.x's Megatron path is not the engine API)."""

from __future__ import annotations

import pytest
import json
import subprocess
import sys

from mcore_dapo.devices import get_adapter
from mcore_dapo.devices.npu import cann_version


@pytest.mark.no_accelerator
def test_env_for_npu_names_what_is_missing_from_the_recipe():
    out = subprocess.run([sys.executable, "-m", "mcore_dapo.cli.main", "env", "--json", "--device", "npu"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    stack = {i["name"]: i for i in info["stack"]}
    assert list(stack) == ["python", "CANN", "torch", "torch_npu", "torchvision", "mindspeed", "megatron-core",
                           "verl", "vllm", "vllm-ascend"]
    assert stack["megatron-core"]["accepted"] == ["0.12.1"] and stack["torch"]["accepted"] == ["2.7.1"]
    # no NPU software on this machine: torch_npu and MindSpeed are named as missing, with how to install them
    assert not stack["torch_npu"]["ok"] and stack["torch_npu"]["installed"] == "absent"
    missing = "\n".join(info["missing"])
    assert "torch_npu 2.7.1 (installed: absent): pip install torch_npu==2.7.1" in missing
    assert "mindspeed 0.12.1 (installed: absent): git clone -b 26.1.0_core_r0.12.1" in missing
    assert len(info["missing"]) == sum(not i["ok"] for i in info["stack"])
    text = subprocess.run([sys.executable, "-m", "mcore_dapo.cli.main", "env", "--device", "npu"],
                          capture_output=True, text=True).stdout
    assert "the npu recipe's stack (docs/ASCEND.md):" in text and "missing for npu" in text


def test_other_devices_have_no_fixed_stack():
    assert get_adapter("cpu").expected_stack() == [] and get_adapter("cuda").expected_stack() == []


def test_stack_versions_accept_builds_of_the_pinned_release():
    req = {r.name: r for r in get_adapter("npu").expected_stack()}
    assert req["torch_npu"].ok("2.7.1.post11") and req["torch_npu"].ok("2.7.1")
    assert not req["torch_npu"].ok("2.7.10") and not req["torch_npu"].ok(None)
    assert req["torch"].ok("2.7.1+cpu") and not req["torch"].ok("2.8.0")
    assert req["vllm"].ok("0.11.0+empty") and req["vllm-ascend"].ok("0.11.0rc1")


def test_cann_version_is_read_from_the_toolkit_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert cann_version() is None
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))
    assert cann_version() == "unknown"
    (tmp_path / "x86_64-linux").mkdir()
    (tmp_path / "x86_64-linux" / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\nversion=9.1.0\n")
    assert cann_version() == "9.1.0"


@pytest.mark.no_accelerator
def test_a2_script_dry_run_names_the_stack_it_expects():
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DRY_RUN": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", str(root / "configs" / "dapo_qwen3_30b_a2.sh")], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    *before, last = p.stdout.strip().splitlines()
    got = json.loads(last)
    assert got["device"] == "npu"
    assert {k: got["expected_stack"][k] for k in ("torch", "mindspeed", "megatron-core", "verl", "vllm")} == {
        "torch": "2.7.1", "mindspeed": "0.12.1", "megatron-core": "0.12.1", "verl": "0.9.1", "vllm": "0.11.0"}
    assert any("torch_npu 2.7.1 (installed: absent)" in m for m in got["missing"])
    assert before and before[-1].startswith("expects on npu: python 3.10, CANN 9.1.0 or 9.0.0, torch 2.7.1")


def test_unsupported_verl_line_names_why_and_the_upgrade_path():
    from mcore_dapo.versions import SUPPORTED_VERL
    from mcore_dapo.verl_plugin.config_checks import unsupported_verl

    old = unsupported_verl("0.6.1", SUPPORTED_VERL)
    assert "\n" not in old and "verl/workers/megatron_workers.py" in old and old.endswith("pip install verl==0.9.1")
    newer = unsupported_verl("0.10.0", SUPPORTED_VERL)
    assert "megatron_workers" not in newer and "supported is verl>=0.9.1,<0.10" in newer
