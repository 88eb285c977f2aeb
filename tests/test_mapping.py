"""Mapping kinds: shards built from HF tensors, and HF tensors rebuilt from shards, bit-exactly."""

import pytest
import torch

from mcore_dapo.bridge import Bridge, Layout, load_hf_config
from mcore_dapo.bridge.mapping import Dims, gated_mlp, qkv, row, vocab
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
    m = gated_mlp("x", "g", "u")
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
        "gated": (gated_mlp("x", "g", "u"), [r(8, 5), r(8, 5)]),
        "row": (row("x", "o"), [r(5, 8)]),
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
