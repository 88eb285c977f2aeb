"""The real vLLM (CPU build) as the rollout engine: trained Megatron weights through verl's own vLLM
weight-update path (ServerAdapter.update_weights -> ZMQ/shared memory -> verl's worker extension ->
vLLM's Qwen3MoeForCausalLM.load_weights), under TP1/EP2, TP2/EP2 and PP2/EP2 in one torchrun launch
with one vLLM engine. The model's vocabulary (300) is one vLLM pads (to 320): the engine's parameters are
compared with the unpadded export over the real vocabulary's rows."""

import pytest

from mcore_dapo.runtime.launch import torchrun

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo; vLLM's CPU build

pytest.importorskip("verl")
pytest.importorskip("vllm")

LAYOUTS = ("tp1-ep2", "tp2-ep2", "pp2-ep2")


@pytest.fixture(scope="module")
def tiny_moe32(tmp_path_factory):
    from mcore_dapo_checks.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny32") / "tiny-qwen3-moe", seed=0, head_dim=32, vocab_size=300)


@pytest.fixture(scope="module")
def run(tiny_moe32):
    return torchrun("mcore_dapo_checks.check_vllm_sync", ["--hf-path", str(tiny_moe32), "--layouts", ",".join(LAYOUTS)],
                    4, timeout=900, env={"OMP_NUM_THREADS": "1"})


def test_engine_holds_the_trained_weights_bit_for_bit(run):
    assert [r["layout"] for r in run["layouts"]] == ["TP1 PP1 EP2 ETP1", "TP2 PP1 EP2 ETP2", "TP1 PP2 EP2 ETP1"]
    for r in run["layouts"]:
        assert r["engine_vs_export"]["exact"], r
        assert r["trained_changed"] > 0.5, r  # the step moved the weights (experts that got no token keep theirs)
    # verl's ServerAdapter.update_weights(global_steps=step) handed each layout's step number to the server
    assert [r["global_steps"] for r in run["layouts"]] == [1, 2, 3]


def test_vllm_logprobs_equal_hf_on_the_checkpoint_it_loaded(run):
    assert run["layouts"][0]["start_logprob_max_diff"] < 1e-5, run["layouts"][0]


def test_vllm_logprobs_equal_hf_on_the_synced_weights(run):
    for r in run["layouts"]:
        assert r["logprob_max_diff"] < 1e-5, r


def test_wrong_engine_model_is_refused_naming_the_mismatch(run):
    m = run["mismatch"]
    assert "mlp.gate.weight' has shape [8, 64] in the trainer but [4, 64]" in m["fewer_experts"]
    assert all("nothing was written" in v for v in m.values())
    assert "model.layers.3." in m["fewer_layers"]
    assert "has shape" in m["wider"]
    assert "LlamaForCausalLM" in m["architecture"]


def test_a_padded_vocabulary_is_compared_over_its_real_rows():
    """vLLM pads embed_tokens / lm_head past the vocabulary (rows its dummy or earlier weights fill); the export
    has the real rows only: those are compared, bit for bit, and nothing else is cut."""
    import torch

    from mcore_dapo_checks.check_vllm_sync import compare, same_weights

    export = torch.randn(300, 8)
    engine = torch.cat([export, torch.randn(20, 8)])  # padded to 320
    names = ("model.embed_tokens.weight", "lm_head.weight")
    assert compare({n: engine for n in names}, {n: export for n in names})["exact"]
    wrong = engine.clone()
    wrong[299, 0] += 1.0  # the last real row
    assert compare({n: wrong for n in names}, {n: export for n in names})["differ"] == 2
    assert not same_weights("model.layers.0.mlp.gate.weight", engine, export)  # not a vocabulary tensor
    assert not same_weights("lm_head.weight", engine.double(), export)
    assert not same_weights("lm_head.weight", engine[:299], export)  # fewer rows than the vocabulary


def test_unsupported_head_dim_is_one_line():
    from mcore_dapo.errors import UserError
    from mcore_dapo.devices.cpu import check_cpu_head_dim

    with pytest.raises(UserError, match=r"head_dim=16 is not supported by vLLM's CPU attention; it accepts"):
        check_cpu_head_dim(16)
    check_cpu_head_dim(32)


def test_device_engine_options_name_rays_own_resources():
    """On a device, the engine actor asks Ray for the resource Ray's accelerator manager sets the visible
    devices from (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES), so it lands on one device."""
    from ray._private.accelerators import NPUAcceleratorManager, NvidiaGPUAcceleratorManager

    from mcore_dapo.bridge.models import get_model
    from mcore_dapo_checks.check_vllm_sync import engine_actor_options, vllm_layout

    assert NvidiaGPUAcceleratorManager.get_resource_name() == "GPU"
    assert engine_actor_options("cuda") == ({"num_gpus": 1}, {"num_cpus": 0, "num_gpus": 1})
    npu = NPUAcceleratorManager.get_resource_name()
    assert engine_actor_options("npu") == ({"resources": {npu: 1}}, {"num_cpus": 0, "resources": {npu: 1}})
    assert engine_actor_options("cpu")[1] == {"num_cpus": 0}
    # the stacked experts' names follow the engine's own (the model's VllmLayout reads them)
    expert_prefix = get_model("Qwen3MoeForCausalLM").vllm.expert_prefix
    assert expert_prefix(["model.layers.0.mlp.experts.routed_experts.w13_weight"]) == "experts.routed_experts."
    assert expert_prefix(["model.layers.0.mlp.experts.w13_weight", "model.layers.0.mlp.gate.weight"]) == "experts."
    import torch

    hf = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": torch.full((2, 3), float(e)) for e in range(2)
          for p in ("gate", "up", "down")}
    hf.update({f"model.layers.0.self_attn.{p}_proj.weight": torch.zeros(3, 3) for p in "qkvo"})
    out = vllm_layout(hf, {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 1, "num_experts": 2},
                      ["model.layers.0.mlp.experts.w13_weight"])
    assert out["model.layers.0.mlp.experts.w13_weight"].shape == (2, 4, 3)
    assert out["model.layers.0.mlp.experts.w2_weight"][1].eq(1).all()
