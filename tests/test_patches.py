"""The patch registry: manifest and implementations agree, version gating, undo, narrowness."""

import subprocess
import sys

import torch

from mcore_dapo.patching import load_implementations, registry


def test_manifest_and_implementations_agree():
    load_implementations()
    manifest = registry.load_manifest()
    assert set(manifest) == registry.implemented_ids()
    for spec in manifest.values():
        assert spec.reason and spec.versions and spec.kind in ("replace", "wrap")


def test_version_gating(tmp_path):
    load_implementations()
    (tmp_path / "m.toml").write_text(
        '[[patch]]\nid = "cpu.megatron.rng-state"\npackage = "megatron-core"\nversions = ">=0.99"\n'
        'target = "x"\nkind = "replace"\ndevices = ["cpu"]\nreason = "r"\n'
        '[[patch]]\nid = "cpu.megatron.moe-router-gemm"\npackage = "no-such-package"\nversions = ">=0"\n'
        'target = "x"\nkind = "replace"\ndevices = ["cpu"]\nreason = "r"\n'
    )
    st = {s.id: s for s in registry.status("cpu", registry.load_manifest(tmp_path / "m.toml"))}
    assert not st["cpu.megatron.rng-state"].applies
    assert "outside >=0.99" in st["cpu.megatron.rng-state"].why_not
    assert st["cpu.megatron.moe-router-gemm"].why_not == "no-such-package is not installed"
    assert registry.status("cuda", registry.load_manifest(tmp_path / "m.toml")) == []


APPLY_AND_UNDO = r"""
import torch, megatron.core.tensor_parallel.random as r, megatron.core.transformer.moe.token_dispatcher as td
from megatron.core.tensor_parallel import mappings
from mcore_dapo.devices import get_adapter
from mcore_dapo.patching import registry
orig = (r._set_cuda_rng_state, td.all_to_all, mappings._gather_along_first_dim, r.torch)
applied = [s.id for s in get_adapter("cpu").apply_patches() if s.applied]
assert r.torch is not torch and r.torch.cuda.current_device() == torch.device("cpu")
assert r.torch.zeros(2, device="cuda").device.type == "cpu"
assert torch.cuda.current_device is not r.torch.cuda.current_device  # real torch untouched
import sys; assert "megatron.core.energy_monitor" not in sys.modules
import megatron.core.energy_monitor as late  # imported after the patch: also retargeted
assert late.torch is r.torch
registry.remove_all()
assert (r._set_cuda_rng_state, td.all_to_all, mappings._gather_along_first_dim, r.torch) == orig
assert late.torch is torch
print(len(applied))
"""


def test_apply_and_undo_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-c", APPLY_AND_UNDO], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) == len(registry.load_manifest())


HF_UNDER_PATCHES = r"""
import sys, torch
from mcore_dapo.devices import get_adapter
import megatron.core.models.gpt  # noqa
get_adapter("cpu").apply_patches()
from mcore_dapo.harness.tiny import hf_reference_logits
ref = torch.load(sys.argv[2])
logits = hf_reference_logits(sys.argv[1], ref["tokens"])
print(float((logits - ref["logits"]).abs().max()))
"""


def test_hf_reference_is_not_disturbed_by_the_cpu_patches(tiny_moe, tiny_moe_ref):
    """The HF model computed in a patched process equals the one from a clean process, bit for bit."""
    out = subprocess.run([sys.executable, "-c", HF_UNDER_PATCHES, str(tiny_moe), str(tiny_moe_ref)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == 0.0
    assert torch.load(tiny_moe_ref)["logits"].abs().max() > 0.1  # the reference itself is not trivial
