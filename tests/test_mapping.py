"""Mapping kinds: shards built from HF tensors, and HF tensors rebuilt from shards, bit-exactly."""

import pytest
import torch

from mcore_dapo.bridge import Bridge, Layout, load_hf_config
from mcore_dapo.bridge.mapping import Dims, Mapping, gated_mlp, qkv, row, vocab
from mcore_dapo.bridge.names import ExpertPlacement, canonical_name

DIMS = Dims(num_attention_heads=8, num_query_groups=4, head_dim=3, vocab_size=10, padded_vocab_size=12)


def test_qkv_is_interleaved_per_kv_group():
    h = 5
    q = torch.arange(8 * 3 * h, dtype=torch.float32).reshape(24, h)
    k = -torch.arange(4 * 3 * h, dtype=torch.float32).reshape(12, h) - 1
    v = 1000 + torch.arange(4 * 3 * h, dtype=torch.float32).reshape(12, h)
    m = qkv("x", "q", "k", "v")
    fused = m.to_megatron([q, k, v], 0, 1, DIMS)
    # group g: its 2 query heads (6 rows), then k_g (3 rows), then v_g (3 rows)
    for g in range(4):
        block = fused[g * 12:(g + 1) * 12]
        assert torch.equal(block[:6], q[g * 6:(g + 1) * 6])
        assert torch.equal(block[6:9], k[g * 3:(g + 1) * 3])
        assert torch.equal(block[9:], v[g * 3:(g + 1) * 3])
    # TP2: rank 1 holds groups 2 and 3 whole
    assert torch.equal(m.to_megatron([q, k, v], 1, 2, DIMS), fused[24:])


def test_gated_mlp_rank_holds_its_gate_and_up_shards():
    gate = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)
    up = 100 + gate
    m = gated_mlp("x", "g", "u", "ffn")
    r1 = m.to_megatron([gate, up], 1, 2, DIMS)
    assert torch.equal(r1, torch.cat([gate[4:], up[4:]]))
    assert not torch.equal(r1, torch.cat([gate, up]).chunk(2)[1])  # the naive contiguous split is wrong


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("kind", ["qkv", "gated", "row", "vocab"])
def test_round_trip_over_ranks(kind, size):
    g = torch.Generator().manual_seed(size)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    m, hf = {
        "qkv": (qkv("x", "q", "k", "v"), [r(24, 5), r(12, 5), r(12, 5)]),
        "gated": (gated_mlp("x", "g", "u", "ffn"), [r(8, 5), r(8, 5)]),
        "row": (row("x", "o", ("hidden", "ffn")), [r(5, 8)]),
        "vocab": (vocab("x", "e"), [r(10, 5)]),
    }[kind]
    shards = [m.to_megatron(hf, i, size, DIMS) for i in range(size)]
    assert all(tuple(s.shape) == m.local_shape([t.shape for t in hf], size, DIMS) for s in shards)
    back = m.to_hf(shards, DIMS)
    assert len(back) == len(hf) and all(torch.equal(a, b) for a, b in zip(back, hf))


def test_vocab_padding_rows_are_zero_and_dropped():
    e = torch.randn(10, 4)
    shards = [vocab("x", "e").to_megatron([e], i, 2, DIMS) for i in range(2)]
    assert shards[1].shape == (6, 4) and torch.all(shards[1][-2:] == 0)


def test_local_names_to_canonical():
    layers = {0: 24, 1: 25}
    ex = ExpertPlacement(ep_rank=3, num_local_experts=16)
    assert canonical_name("decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight", layers, ex) == \
        "decoder.layers.25.mlp.experts.50.linear_fc1.weight"
    assert canonical_name("decoder.layers.0.mlp.experts.linear_fc2.weight15", layers, ex) == \
        "decoder.layers.24.mlp.experts.63.linear_fc2.weight"
    assert canonical_name("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", layers, ex) == \
        "decoder.layers.24.input_layernorm.weight"
    assert canonical_name("output_layer.weight", layers, ex) == "output_layer.weight"
    assert ex.to_local(50) == 2 and ex.to_local(5) is None


def test_every_hf_tensor_of_the_real_model_has_one_mapping(reference_config):
    b = Bridge(load_hf_config(reference_config), Layout(tp=2, ep=8))
    names = b.hf_names()
    assert len(names) == len(set(names)) == 18867
    for n in ("model.layers.47.mlp.experts.127.down_proj.weight", "lm_head.weight", "model.norm.weight"):
        assert n in names
        assert b.resolve_hf(n).mapping in b.table
    with pytest.raises(KeyError):
        b.resolve("decoder.layers.0.mlp.shared_experts.linear_fc1.weight")


def test_tiny_checkpoint_names_are_exactly_the_bridge_names(tiny_moe):
    from mcore_dapo.io.hf_reader import HFReader

    with HFReader(tiny_moe) as r:
        assert sorted(r.keys()) == sorted(Bridge.from_hf(tiny_moe).hf_names())


def _explicit_hf_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every HF tensor and its shape, written out name by name (what the table must derive)."""
    h, d = cfg.hidden_size, cfg.head_dim
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (cfg.num_attention_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = (cfg.num_key_value_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = (cfg.num_key_value_heads * d, h)
        out[p + "self_attn.q_norm.weight"] = (d,)
        out[p + "self_attn.k_norm.weight"] = (d,)
        out[p + "self_attn.o_proj.weight"] = (h, cfg.num_attention_heads * d)
        out[p + "post_attention_layernorm.weight"] = (h,)
        if cfg.is_moe_layer(layer):
            out[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            f = cfg.moe_intermediate_size
            for e in range(cfg.num_experts):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = (f, h)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = (f, h)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = (h, f)
        else:
            f = cfg.intermediate_size
            out[p + "mlp.gate_proj.weight"] = (f, h)
            out[p + "mlp.up_proj.weight"] = (f, h)
            out[p + "mlp.down_proj.weight"] = (h, f)
    out["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    return out


@pytest.mark.parametrize("change", [{}, {"model_type": "qwen3", "num_hidden_layers": 3},
                                    {"num_hidden_layers": 5, "mlp_only_layers": [0, 3]},
                                    {"num_hidden_layers": 4, "decoder_sparse_step": 2},
                                    {"num_hidden_layers": 2, "tie_word_embeddings": True}],
                         ids=["qwen3-30b-a3b", "dense", "mlp-only-layers", "sparse-step", "tied"])
def test_hf_shapes_come_from_the_table_in_checkpoint_order(reference_config, change):
    from mcore_dapo.bridge import parse_hf_config

    cfg = parse_hf_config({**load_hf_config(reference_config).raw, **change})
    b = Bridge(cfg)
    assert list(b.hf_shapes().items()) == list(_explicit_hf_shapes(cfg).items())
    assert sorted(b.hf_shapes()) == sorted(b.hf_names())


def test_table_parts_pick_each_layers_mlp(tiny_dense):
    from mcore_dapo.bridge import parse_hf_config

    mixed = Bridge(parse_hf_config({**load_hf_config(tiny_dense).raw, "model_type": "qwen3_moe", "num_experts": 4,
                                    "num_experts_per_tok": 2, "moe_intermediate_size": 16, "mlp_only_layers": [0]}))
    layer0 = [r.megatron for r in mixed.all_resolved if r.layer == 0]
    layer1 = [r.megatron for r in mixed.all_resolved if r.layer == 1]
    assert "decoder.layers.0.mlp.linear_fc1.weight" in layer0 and not any(".mlp.experts." in n for n in layer0)
    assert "decoder.layers.1.mlp.router.weight" in layer1 and "decoder.layers.1.mlp.linear_fc1.weight" not in layer1
    experts = [r for r in mixed.all_resolved if r.mapping.per_expert]
    assert {r.megatron for r in experts} == {f"decoder.layers.{L}.mlp.experts.{e}.linear_fc{i}.weight"
                                             for L in (1, 2, 3) for e in range(4) for i in (1, 2)}
    assert not mixed.resolve("decoder.layers.1.mlp.router.weight").mapping.per_expert
    assert all(m.part in ("common", "dense_mlp", "moe") for m in mixed.table)


def test_the_table_says_which_output_layer_is_a_copy(tiny_dense):
    from mcore_dapo.bridge import parse_hf_config

    raw = load_hf_config(tiny_dense).raw
    tied = Bridge(parse_hf_config({**raw, "tie_word_embeddings": True})).resolve("output_layer.weight")
    assert tied.megatron == "embedding.word_embeddings.weight" and tied.hf == ("model.embed_tokens.weight",)
    untied = Bridge(parse_hf_config({**raw, "tie_word_embeddings": False})).resolve("output_layer.weight")
    assert untied.megatron == "output_layer.weight" and untied.hf == ("lm_head.weight",)


def test_te_fused_norms_are_one_map_for_names_and_checkpoint_keys(tiny_dense):
    from mcore_dapo.bridge.names import te_fused_norms

    assert te_fused_norms(moe_layer=True) == {"input_layernorm.": "self_attention.linear_qkv.layer_norm_"}
    dense = te_fused_norms(moe_layer=False)
    assert dense == {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                     "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}
    b = Bridge.from_hf(tiny_dense)
    for norm, fused in dense.items():
        canon = canonical_name(f"decoder.layers.1.{fused}weight", {1: 3}, None)
        assert canon == f"decoder.layers.3.{norm}weight" and b.resolve(canon).megatron == canon


def test_fused_experts_of_transformers_5_unfuse_to_hub_names_and_back():
    from mcore_dapo.bridge.models.qwen3.table import hub_slices

    experts, inter, hidden = 3, 4, 5
    g = torch.Generator().manual_seed(0)
    hub = {f"model.layers.7.mlp.experts.{e}.{k}_proj.weight": torch.randn(*shape, generator=g)
           for e in range(experts) for k, shape in (("gate", (inter, hidden)), ("up", (inter, hidden)),
                                                    ("down", (hidden, inter)))}
    gate_up = torch.stack([torch.cat([hub[f"model.layers.7.mlp.experts.{e}.gate_proj.weight"],
                                      hub[f"model.layers.7.mlp.experts.{e}.up_proj.weight"]]) for e in range(experts)])
    down = torch.stack([hub[f"model.layers.7.mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    fused = {"model.layers.7.mlp.experts.gate_up_proj": gate_up, "model.layers.7.mlp.experts.down_proj": down}
    unfused = {h: t[i] for n, t in fused.items() for h, i in hub_slices(n, tuple(t.shape)).items()}
    assert unfused.keys() == hub.keys() and all(torch.equal(unfused[n], hub[n]) for n in hub)
    back = {n: torch.full_like(t, float("nan")) for n, t in fused.items()}
    for n, t in back.items():
        for h, i in hub_slices(n, tuple(t.shape)).items():
            t[i] = hub[h]
    assert all(torch.equal(back[n], fused[n]) for n in fused)
    assert hub_slices("model.layers.7.mlp.gate.weight", (3, 5)) == {"model.layers.7.mlp.gate.weight": ()}


def test_a_table_entry_declares_a_known_part_and_one_shape_per_hf_name():
    with pytest.raises(ValueError, match="part 'shared'"):
        row("x", "o", ("hidden", "ffn"), part="shared")
    with pytest.raises(ValueError, match="1 shapes for 2 HF names"):
        Mapping("x", ("g", "u"), (("ffn", "hidden"),))
