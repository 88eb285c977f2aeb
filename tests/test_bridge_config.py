"""HF config -> Megatron settings, on the real Qwen3-30B-A3B config and on bad input."""

import json

import pytest

from mcore_dapo.bridge import Bridge, Layout, load_hf_config, parse_hf_config
from mcore_dapo.bridge.megatron_config import gpt_model_kwargs, padded_vocab_size, transformer_config_kwargs
from mcore_dapo.errors import UserError


def test_qwen3_30b_a3b_maps_to_megatron(reference_config):
    cfg = load_hf_config(reference_config)
    kw = transformer_config_kwargs(cfg, Layout(tp=4, ep=8), dtype="bf16")
    assert kw["num_layers"] == 48
    assert kw["hidden_size"] == 2048
    assert kw["num_attention_heads"] == 32
    assert kw["num_query_groups"] == 4
    assert kw["kv_channels"] == 128  # head_dim, not hidden / heads (= 64)
    assert kw["num_moe_experts"] == 128
    assert kw["moe_router_topk"] == 8
    assert kw["moe_ffn_hidden_size"] == 768
    assert kw["ffn_hidden_size"] == 6144
    assert kw["moe_router_pre_softmax"] is False  # norm_topk_prob: top-k, then softmax over the k
    assert kw["qk_layernorm"] is True
    assert kw["normalization"] == "RMSNorm"
    assert kw["layernorm_epsilon"] == 1e-6
    assert kw["gated_linear_unit"] and not kw["add_bias_linear"]
    assert kw["moe_layer_freq"] == 1  # every layer MoE: stacked checkpoint keys, as standard configs
    assert kw["moe_aux_loss_coeff"] == 0.001
    assert kw["tensor_model_parallel_size"] == 4 and kw["expert_model_parallel_size"] == 8
    assert kw["sequence_parallel"] is True  # MoE with TP>1 requires it
    assert kw["bf16"] and kw["params_dtype"] == "bfloat16"
    gm = gpt_model_kwargs(cfg, Layout(tp=4, ep=8))
    assert gm["rotary_base"] == 1_000_000
    assert gm["share_embeddings_and_output_weights"] is False
    assert gm["vocab_size"] == 151936  # no padding needed up to TP4
    b = Bridge(cfg, Layout(tp=4, ep=8))
    assert len(b.hf_names()) == 18867


def test_real_config_builds_a_megatron_transformer_config(reference_config):
    from mcore_dapo.bridge.megatron_config import build_transformer_config

    tf = build_transformer_config(load_hf_config(reference_config), Layout(tp=1, ep=8), dtype="bf16")
    assert tf.num_moe_experts == 128 and tf.kv_channels == 128 and tf.moe_router_topk == 8


def test_both_spellings_of_the_hf_config_agree(reference_config):
    raw = json.loads(reference_config.read_text())
    old = dict(raw)  # transformers 4.x: num_experts, rope_theta, torch_dtype
    new = {k: v for k, v in raw.items() if k not in ("num_experts", "rope_theta", "torch_dtype")}
    new.update(num_local_experts=raw["num_experts"], dtype=raw["torch_dtype"],
               rope_parameters={"rope_theta": raw["rope_theta"], "rope_type": "default"})
    a, b = parse_hf_config(old), parse_hf_config(new)
    assert a.summary() == b.summary()
    assert a.num_experts == 128 and a.rope_theta == 1e6


def test_transformers_written_config_is_read(tiny_moe):
    raw = json.loads((tiny_moe / "config.json").read_text())
    assert "num_local_experts" in raw  # transformers 5 spelling
    assert load_hf_config(tiny_moe).num_experts == 8


@pytest.mark.parametrize("vocab,tp,div,expected", [(151936, 1, None, 151936), (151936, 4, None, 151936),
                                                   (151936, 8, None, 151936), (250, 2, None, 250),
                                                   (256, 2, 64, 256), (250, 2, 64, 256), (250, 4, 64, 256)])
def test_vocab_padding(vocab, tp, div, expected):
    assert padded_vocab_size(vocab, tp, div) == expected


def test_dense_qwen3_and_mixed_layers(tiny_dense):
    cfg = load_hf_config(tiny_dense)
    kw = transformer_config_kwargs(cfg, Layout(tp=2))
    assert "num_moe_experts" not in kw
    mixed = parse_hf_config({**load_hf_config(tiny_dense).raw, "model_type": "qwen3_moe", "num_experts": 4,
                             "num_experts_per_tok": 2, "moe_intermediate_size": 16, "mlp_only_layers": [0]})
    assert transformer_config_kwargs(mixed, Layout())["moe_layer_freq"] == [0, 1, 1, 1]


@pytest.mark.parametrize("change,message", [
    ({"model_type": "llama"}, "model_type='llama' is not supported: accepted are qwen3_moe, qwen3"),
    ({"use_sliding_window": True, "sliding_window": 4096}, "use_sliding_window=True"),
    ({"shared_expert_intermediate_size": 512}, "shared_expert_intermediate_size=512"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4}}, "rope scaling"),
])
def test_unsupported_configs_are_refused(reference_config, change, message):
    raw = {**json.loads(reference_config.read_text()), **change}
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("[", r"\[")):
        parse_hf_config(raw)


def test_missing_config_and_bad_json(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    with pytest.raises(UserError, match="lacks the field"):
        load_hf_config(tmp_path)


def test_two_stage_split_is_set_by_the_first_stage(tiny_moe):
    """PP2 with first and last stage sizes (the A2 script's 26/22): Megatron derives the last stage from the
    first and divides by the middle stages' count when both are set; the bridge keeps the first alone."""
    from mcore_dapo.bridge.megatron_config import build_transformer_config

    cfg = load_hf_config(tiny_moe)
    tf = build_transformer_config(cfg, Layout(pp=2), {"num_layers_in_first_pipeline_stage": 3,
                                                      "num_layers_in_last_pipeline_stage": 1}, dtype="fp32")
    assert (tf.num_layers_in_first_pipeline_stage, tf.num_layers_in_last_pipeline_stage) == (3, None)
    with pytest.raises(UserError, match="cover 3 of the 4 layers"):
        build_transformer_config(cfg, Layout(pp=2), {"num_layers_in_first_pipeline_stage": 2,
                                                     "num_layers_in_last_pipeline_stage": 1}, dtype="fp32")


def test_the_a2_scripts_layout_builds_its_transformer_config(reference_config):
    # configs/dapo_qwen3_30b_a2.sh: TP1, PP2 with 26/22 layers, VPP2, EP8 (Megatron refused both sizes at PP2)
    from mcore_dapo.bridge.megatron_config import build_transformer_config

    tf = build_transformer_config(load_hf_config(reference_config), Layout(pp=2, vpp=2, ep=8),
                                  {"num_layers_in_first_pipeline_stage": 26, "num_layers_in_last_pipeline_stage": 22},
                                  dtype="bf16")
    assert tf.num_layers_in_first_pipeline_stage == 26 and tf.virtual_pipeline_model_parallel_size == 2
    assert tf.overlap_p2p_comm and not tf.batch_p2p_comm  # the interleaved schedule's p2p (megatron_config)
