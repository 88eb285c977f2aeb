"""The device adapters' fast paths (docs/PERFORMANCE.md): what each device turns on, under what the user asks,
and the grouped experts' names and checkpoint keys against the pinned megatron-core sources.

The real TEGroupedMLP (on MindSpeed's grouped linear) is built, loaded, exported and compared with
SequentialMLP's checkpoint shards in tests/test_mindspeed.py; Transformer Engine's own grouped linear cannot
be built here (no TE on the CPU), so its keys are checked against the sources below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mcore_dapo.bridge import Layout, load_hf_config
from mcore_dapo.devices import get_adapter
from mcore_dapo.errors import UserError

MODEL = Path(__file__).resolve().parent.parent / "configs" / "models" / "qwen3-30b-a3b"


@pytest.fixture(scope="module")
def qwen3_30b():
    return load_hf_config(MODEL)


def test_cpu_keeps_the_unfused_path(qwen3_30b):
    cpu = get_adapter("cpu")
    paths = cpu.fast.paths(qwen3_30b, Layout(ep=8))
    assert paths and not any(p.on for p in paths)
    assert cpu.fast.fields(qwen3_30b, Layout(ep=8)) == {} and cpu.fast.flags(qwen3_30b, Layout(ep=8)) == {}
    assert cpu.fast.warning(qwen3_30b, Layout(ep=8)) is None


def test_cuda_with_the_recipes_transformer_engine_turns_on_grouped_gemm_and_the_fusions(qwen3_30b):
    cuda = get_adapter("cuda")
    fields = cuda.fast.fields(qwen3_30b, Layout(ep=8), recipe=True)
    assert fields == {"moe_grouped_gemm": True, "moe_permute_fusion": True, "attention_backend": "flash",
                      "apply_rope_fusion": True, "bias_activation_fusion": True}
    off = {p.setting: p.reason for p in cuda.fast.paths(qwen3_30b, Layout(ep=8), recipe=True) if not p.on}
    # megatron-core 0.16.1 imports TE's fused router from TE 2.7.0 (extensions/transformer_engine.py); the
    # recipe's TE is the `cuda` extra's lower bound, 2.6
    assert off["moe_router_fusion"].startswith("needs Transformer Engine >= 2.7, the recipe installs 2.6")
    # Megatron's ColumnParallelLinear (the output layer) refuses the fusion without apex's extension
    assert "fused_weight_gradient_mlp_cuda" in off["gradient_accumulation_fusion"]


@pytest.mark.no_accelerator  # asserts that Transformer Engine does not import here
def test_cuda_without_transformer_engine_keeps_megatrons_swiglu_fusion_and_warns_in_one_line(qwen3_30b):
    cuda = get_adapter("cuda")
    assert cuda.fast.fields(qwen3_30b, Layout(ep=8)) == {"bias_activation_fusion": True}
    warning = cuda.fast.warning(qwen3_30b, Layout(ep=8))
    assert warning == ("cuda: running without moe_grouped_gemm, moe_permute_fusion, moe_router_fusion, attention_backend, "
                       "apply_rope_fusion, gradient_accumulation_fusion: transformer_engine does not import here")
    # Megatron's own SwiGLU fusion needs no TE: its TransformerConfig checks pass for Qwen3 (SiLU, gated)
    from mcore_dapo.bridge.megatron_config import build_transformer_config

    tf = build_transformer_config(qwen3_30b, Layout(ep=8), {"bias_activation_fusion": True})
    assert tf.bias_activation_fusion is True and tf.moe_grouped_gemm is False


def test_megatrons_swiglu_fusion_needs_no_transformer_engine_and_equals_the_unfused_swiglu():
    """What bias_activation_fusion runs for Qwen3's MLPs (SiLU, gated, no bias: megatron/core/transformer/mlp.py
    calls bias_swiglu_impl), from megatron/core/fusions/fused_bias_swiglu.py, against SiLU(gate) * up."""
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    torch.manual_seed(0)
    x = torch.randn(4, 3, 64, requires_grad=True)
    fused = bias_swiglu_impl(x, None, False, False)
    (fused_grad,) = torch.autograd.grad(fused.sum(), x)
    gate, up = torch.chunk(x, 2, -1)
    plain = F.silu(gate) * up
    (plain_grad,) = torch.autograd.grad(plain.sum(), x)
    # fp32 rounding: the fused backward recomputes the SiLU its own way (measured 0.0 forward, 2.4e-7 backward)
    assert (fused - plain).abs().max() < 1e-6 and (fused_grad - plain_grad).abs().max() < 1e-6


def test_ascend_turns_on_mindspeeds_flags_where_their_conditions_hold(qwen3_30b):
    npu = get_adapter("npu")
    flags = npu.fast.flags(qwen3_30b, Layout(tp=4, ep=2), recipe=True)
    assert flags == {"use_flash_attn": True, "use_fused_rmsnorm": True, "use_fused_swiglu": True,
                     "use_fused_rotary_pos_emb": True, "gemm_gradient_accumulation_fusion": True,
                     "moe_permutation_async_comm": True, "moe_alltoall_overlap_comm": True}
    assert npu.fast.fields(qwen3_30b, Layout(tp=4, ep=2), recipe=True) == {
        "moe_grouped_gemm": True, "moe_permute_fusion": True, "bias_activation_fusion": True}
    # mindspeed/features_manager/moe/moe_alltoall_overlap.py: EP > 1 and the alltoall dispatcher
    at_ep1 = {p.setting: p for p in npu.fast.paths(qwen3_30b, Layout(tp=8), recipe=True)}
    assert not at_ep1["moe_alltoall_overlap_comm"].on
    assert at_ep1["moe_alltoall_overlap_comm"].reason.startswith("needs expert_model_parallel_size > 1")
    allgather = {p.setting: p for p in npu.fast.paths(qwen3_30b, Layout(ep=8), recipe=True, dispatcher="allgather")}
    assert not allgather["moe_alltoall_overlap_comm"].on and not allgather["moe_permute_fusion"].on
    # repatch applies features without their validate_args (mindspeed/megatron_adaptor.py): refused here instead
    with pytest.raises(UserError) as e:
        npu.fast.check_overrides(qwen3_30b, Layout(tp=8), {"moe_alltoall_overlap_comm": True}, recipe=True)
    assert str(e.value).startswith("override_transformer_config.moe_alltoall_overlap_comm=True cannot run on npu: "
                                   "needs expert_model_parallel_size > 1, the layout has 1")
    assert "\n" not in str(e.value)


def test_router_fusion_stays_off_under_router_replay_and_is_refused_when_asked(qwen3_30b):
    # megatron-core 0.16.1 moe_utils.topk_routing_with_score_function returns the fused kernel's top-k before
    # its first use of router_replay: replayed routes would be ignored (0.12.1 has neither)
    src = _megatron_source("transformer/moe/moe_utils.py")
    func = src[src.index("def topk_routing_with_score_function"):]
    func = func[:func.index("\ndef ")]
    if "router_replay" in func:
        uses = [m.start() for m in re.finditer(r"router_replay(\.| is )", func)]
        assert uses and func.index("return fused_topk_with_score_function(") < min(uses)
    cuda = get_adapter("cuda")
    paths = {p.setting: p for p in cuda.fast.paths(qwen3_30b, Layout(ep=8), replay=True, recipe=True)}
    assert not paths["moe_router_fusion"].on
    with pytest.raises(UserError, match=r"^override_transformer_config.moe_router_fusion=True cannot run on cuda: "
                                        r"router replay is on: the fused top-k returns before the replay"):
        cuda.fast.check_overrides(qwen3_30b, Layout(ep=8), {"moe_router_fusion": True}, replay=True, te="2.8")
    # with a TE that has the fused router, and no replay, it is on
    assert cuda.fast.fields(qwen3_30b, Layout(ep=8), te="2.8")["moe_router_fusion"] is True


def test_the_users_override_transformer_config_wins_over_each_fast_path(qwen3_30b):
    from mcore_dapo.bridge import Bridge
    from mcore_dapo.runtime.model import fast_path_overrides

    bridge = Bridge(qwen3_30b, Layout(ep=8))
    cuda = get_adapter("cuda")
    fast = cuda.fast.fields(qwen3_30b, Layout(ep=8))
    for setting in fast:
        assert fast_path_overrides(bridge, cuda, {setting: False})[setting] is False
    # gradient_accumulation_fusion only for a model Megatron's DDP wraps (the fused wgrad needs main_grad)
    assert "gradient_accumulation_fusion" not in fast_path_overrides(bridge, cuda, {})


@pytest.mark.no_accelerator  # asserts that Transformer Engine does not import here
def test_grouped_gemm_asked_on_cuda_without_transformer_engine_is_one_line_before_ray(qwen3_30b, caplog):
    from mcore_dapo.verl_plugin.config_checks import check_fast_paths

    def config(device, overrides, replay="disabled"):
        return OmegaConf.create({"trainer": {"device": device}, "actor_rollout_ref": {"actor": {"megatron": {
            "override_transformer_config": overrides, "router_replay": {"mode": replay}}}}})

    with pytest.raises(UserError) as e:
        check_fast_paths(config("cuda", {"moe_grouped_gemm": True}), qwen3_30b, Layout(ep=8))
    assert str(e.value) == ("override_transformer_config.moe_grouped_gemm=True cannot run on cuda: transformer_engine "
                            "does not import here (TEGroupedMLP; without TE Megatron's local spec builds SequentialMLP, "
                            "megatron/core/models/backends.py); accepted here is moe_grouped_gemm=False")
    # a dry run elsewhere (here=False) leaves what depends on this machine's software to the launch
    check_fast_paths(config("cuda", {"moe_grouped_gemm": True}), qwen3_30b, Layout(ep=8), here=False)
    # what the device itself cannot run is refused anywhere: the CPU, router fusion with replay
    with pytest.raises(UserError, match="apply_rope_fusion=True cannot run on cpu"):
        check_fast_paths(config("cpu", {"apply_rope_fusion": True}), qwen3_30b, Layout(ep=8), here=False)
    # off, null and verl's attention_backend default are no request; a launch logs the one warning line
    import logging

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mcore_dapo"):
        check_fast_paths(config("cuda", {"moe_grouped_gemm": False, "apply_rope_fusion": None,
                                         "attention_backend": "flash"}), qwen3_30b, Layout(ep=8))
    assert [r.getMessage() for r in caplog.records] == [get_adapter("cuda").fast.warning(qwen3_30b, Layout(ep=8))]
    assert caplog.records[0].getMessage().startswith("cuda: running without moe_grouped_gemm, ")


def test_legacy_grouped_mlp_is_refused_in_one_line(qwen3_30b):
    from mcore_dapo.bridge.megatron_config import build_transformer_config

    with pytest.raises(UserError, match=r"^moe_use_legacy_grouped_gemm=True builds Megatron's legacy GroupedMLP"):
        build_transformer_config(qwen3_30b, Layout(ep=8), {"moe_grouped_gemm": True, "moe_use_legacy_grouped_gemm": True})


def _megatron_source(rel: str) -> str:
    import megatron.core

    return (Path(megatron.core.__file__).parent / rel).read_text()


def test_te_grouped_mlp_parameters_and_checkpoint_keys_match_the_bridge():
    """TEGroupedMLP of the installed megatron-core (both lines): TE's grouped linear registers one parameter per
    local expert, ``weight{i}`` (megatron/core/extensions/transformer_engine.py, TEGroupedLinear's
    ``_sharded_state_dict_grouped``), and TEGroupedMLP.sharded_state_dict (megatron/core/transformer/moe/
    experts.py) renames ``linear_fc1.`` to ``experts.linear_fc1.`` "to match sequential's keys", with the global
    expert on its own axis: SequentialMLP's keys, which the bridge's checkpoints carry."""
    te = _megatron_source("extensions/transformer_engine.py")
    experts = _megatron_source("transformer/moe/experts.py")
    assert re.search(r'\[f"?\'?weight\{gemm_idx\}', te) or "weight{gemm_idx}" in te
    assert "replace_prefix_for_sharding(sub_sd, f'{name}.', f'{prefix}experts.{name}.')" in experts
    assert "local_expert_indices_offset + i" in experts  # TEGroupedMLP's expert axis offset: the global expert
    from mcore_dapo.bridge.names import ExpertPlacement, canonical_name

    # EP rank 1 of 2, 64 local experts: local weight5 is global expert 69 in both containers
    placement = ExpertPlacement(ep_rank=1, num_local_experts=64)
    for k in (1, 2):
        te_name = canonical_name(f"decoder.layers.3.mlp.experts.linear_fc{k}.weight5", {3: 27}, placement)
        seq_name = canonical_name(f"decoder.layers.3.mlp.experts.local_experts.5.linear_fc{k}.weight", {3: 27}, placement)
        assert te_name == seq_name == f"decoder.layers.27.mlp.experts.69.linear_fc{k}.weight"


def test_plan_show_config_gives_each_layouts_megatron_settings_with_the_devices_recipe_stack(capsys):
    import json

    from mcore_dapo.bridge.megatron_config import transformer_config_kwargs
    from mcore_dapo.cli.analysis import main as cli

    assert cli(["plan", "--model", str(MODEL), "--nodes", "1", "--devices-per-node", "8", "--device", "h200",
                "--top", "3", "--json", "--show-config"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["candidates"]) == 3
    for row in out["candidates"]:
        mc = row["megatron"]
        assert row["device"] == "cuda" and row["stack"] == "Transformer Engine 2.6" and "mindspeed" not in row
        # the layout's own sizes, the mapping's fields and the fast paths of TE on CUDA
        assert mc["tensor_model_parallel_size"] == row["tp"] and mc["expert_model_parallel_size"] == row["ep"]
        assert mc["moe_grouped_gemm"] is True and mc["moe_permute_fusion"] is True and mc["apply_rope_fusion"] is True
        assert mc["bias_activation_fusion"] is True and mc["attention_backend"] == "flash"
        assert mc["recompute_granularity"] == "full" and mc["moe_router_dtype"] == "fp32"
        assert set(row["fast_paths_off"]) == {"moe_router_fusion", "gradient_accumulation_fusion"}
        # every key is a field the mapping sets or a fast path (TransformerConfig field names)
        mapped = set(transformer_config_kwargs(load_hf_config(MODEL), Layout(tp=row["tp"], ep=row["ep"])))
        assert set(mc) - mapped <= {"moe_grouped_gemm", "moe_permute_fusion", "apply_rope_fusion", "attention_backend",
                                     "bias_activation_fusion", "num_layers_in_first_pipeline_stage",
                                     "num_layers_in_last_pipeline_stage", "recompute_granularity",
                                     "recompute_method", "recompute_num_layers", "overlap_p2p_comm", "batch_p2p_comm",
                                     "virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size",
                                     "context_parallel_size", "expert_tensor_parallel_size"}
    assert cli(["plan", "--model", str(MODEL), "--nodes", "2", "--devices-per-node", "8", "--device", "a2",
                "--top", "1", "--json", "--show-config"]) == 0
    row = json.loads(capsys.readouterr().out)["candidates"][0]
    assert row["device"] == "npu" and row["megatron"]["moe_grouped_gemm"] is True
    assert row["mindspeed"]["use_fused_rmsnorm"] is True and row["mindspeed"]["use_flash_attn"] is True
    assert row["mindspeed"]["moe_alltoall_overlap_comm"] is (row["ep"] > 1)
    assert cli(["plan", "--model", str(MODEL), "--nodes", "1", "--devices-per-node", "8", "--device", "h100",
                "--top", "1", "--show-config"]) == 0
    text = capsys.readouterr().out
    assert "#1 " in text and " on cuda (Transformer Engine 2.6):" in text and "moe_grouped_gemm=True" in text
    assert "  off: moe_router_fusion: needs Transformer Engine >= 2.7" in text


@pytest.mark.no_accelerator  # asserts what this host lacks: Transformer Engine, MindSpeed
def test_env_says_which_fast_paths_run_here_and_why_the_others_do_not():
    from mcore_dapo.env import collect, render

    cuda = {p["setting"]: p for p in collect("cuda")["fast_paths"]}
    assert cuda["bias_activation_fusion"]["on"] is True
    assert cuda["moe_grouped_gemm"]["on"] is False
    assert cuda["moe_grouped_gemm"]["reason"].startswith("transformer_engine does not import here")
    npu = collect("npu")
    assert all(not p["on"] and p["reason"].startswith("MindSpeed or torch_npu is not installed here")
               for p in npu["fast_paths"])
    text = render(npu)
    assert "fast paths on npu here" in text and "off use_fused_rmsnorm" in text
    assert all(not p["on"] for p in collect("cpu")["fast_paths"])


def test_ascend_configure_flags_give_every_flag_and_follow_the_users_grouped_gemm(qwen3_30b):
    npu = get_adapter("npu")
    flags = npu.fast.configure_flags(qwen3_30b, Layout(tp=8), {"use_fused_rmsnorm": False}, 1, recipe=True)
    # the user's flag wins; an off flag is given as False (repatch keeps values it is not given); the dispatcher
    # and the position embedding that MindSpeed's feature checks read on every TransformerConfig
    assert flags["use_fused_rmsnorm"] is False and flags["moe_alltoall_overlap_comm"] is False
    assert flags["moe_grouped_gemm"] is True and flags["gemm_gradient_accumulation_fusion"] is True
    assert flags["moe_token_dispatcher_type"] == "alltoall" and flags["position_embedding_type"] == "rope"
    # grouped GEMM off: what needs it (mindspeed/features_manager/moe/gmm.py, moe_alltoall_overlap.py) goes off
    off = npu.fast.configure_flags(qwen3_30b, Layout(ep=8), {"moe_grouped_gemm": False}, 1, recipe=True)
    assert off["moe_grouped_gemm"] is False
    assert off["gemm_gradient_accumulation_fusion"] is False and off["moe_alltoall_overlap_comm"] is False
    with pytest.raises(UserError, match=r"^override_transformer_config.gemm_gradient_accumulation_fusion=True cannot "
                                        r"run on npu: needs moe_grouped_gemm, which is off"):
        npu.fast.configure_flags(qwen3_30b, Layout(ep=8), {"moe_grouped_gemm": False,
                                                      "gemm_gradient_accumulation_fusion": True}, 1, recipe=True)
    # devices without feature flags get none
    assert get_adapter("cuda").fast.configure_flags(qwen3_30b, Layout(ep=8), {"attention_backend": "flash"}) == {}


def test_a_dense_model_gets_no_moe_settings(tiny_dense):
    dense = load_hf_config(tiny_dense)
    for device in ("cuda", "npu"):
        paths = get_adapter(device).fast.paths(dense, Layout(tp=2), recipe=True)
        assert paths and not any(p.setting.startswith(("moe_", "gemm_")) for p in paths), (device, paths)
    assert get_adapter("cuda").fast.fields(dense, Layout(tp=2), recipe=True) == {
        "attention_backend": "flash", "apply_rope_fusion": True, "bias_activation_fusion": True}
    flags = get_adapter("npu").fast.configure_flags(dense, Layout(tp=2), {}, 1, recipe=True)
    assert "moe_token_dispatcher_type" not in flags and flags["use_fused_rmsnorm"] is True
