"""The planner's per-rank parameter counts equal those of the real sharded Megatron model.

Three torchrun launches (world sizes 1, 2 and 4), each building its layouts one after the other
with Megatron's parallel state re-initialised in between. Three tiny Qwen3-MoE models: all-MoE
(model 0), mixed dense/MoE layers (model 1: layers 0 and 3 dense, so the layer placement of
pipeline and virtual stages matters), and tied embeddings (model 2).

Not built here: CP > 1 (Megatron's local attention refuses it; CP changes no parameter count) and
tied embeddings with PP > 1 (Megatron moves the shared weight with ``.cuda()`` when it builds it).
"""

import json

import pytest

from mcore_dapo.runtime.launch import torchrun

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo

LAYOUTS = {
    1: [{}, {"model": 1}, {"model": 2}],
    2: [
        {"tp": 2}, {"ep": 2}, {"etp": 2}, {"pp": 2}, {"pp": 2, "vpp": 2},
        {"pp": 2, "first": 1, "last": 3}, {"pp": 2, "first": 3, "last": 1},
        {"model": 1, "pp": 2, "vpp": 2}, {"model": 1, "pp": 2, "first": 1, "last": 3},
        {"model": 2, "tp": 2},
    ],
    4: [
        {"tp": 4}, {"ep": 4}, {"tp": 2, "ep": 2, "etp": 1}, {"tp": 2, "ep": 2, "etp": 2},
        {"ep": 2, "etp": 2}, {"pp": 2, "ep": 2}, {"pp": 4}, {"tp": 2, "pp": 2, "vpp": 2},
        {"pp": 2, "ep": 2, "first": 1, "last": 3}, {"etp": 4, "ep": 1, "tp": 1},
        {"model": 1, "pp": 2, "vpp": 2, "ep": 2}, {"model": 1, "pp": 4},
        {"model": 1, "tp": 2, "pp": 2, "first": 3, "last": 1}, {"model": 2, "tp": 2, "ep": 2},
    ],
}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from mcore_dapo_checks.tiny import make_tiny_model

    root = tmp_path_factory.mktemp("plan-models")
    return [
        make_tiny_model(root / "moe", seed=0),
        make_tiny_model(root / "mixed", seed=1, mlp_only_layers=[0, 3]),
        make_tiny_model(root / "tied", seed=2, tie_word_embeddings=True),
    ]


@pytest.fixture(scope="module")
def built(tiny_models):
    """Each world size's launch, run once: every layout built by Megatron and compared."""
    args = [a for m in tiny_models for a in ("--hf-path", str(m))]
    return {world: torchrun("mcore_dapo_checks.plan_params", [*args, "--layouts", json.dumps(LAYOUTS[world])],
                            world, timeout=300) for world in LAYOUTS}


@pytest.mark.parametrize("world", sorted(LAYOUTS))
def test_predicted_rank_params_equal_megatron(built, world):
    r = built[world]
    assert len(r["layouts"]) == len(LAYOUTS[world])
    for lay in r["layouts"]:
        assert lay["world_size"] == world
        assert len(lay["ranks"]) == world
        for rank in lay["ranks"]:
            assert (rank["dense"], rank["expert"]) == (rank["predicted_dense"], rank["predicted_expert"]), lay
    assert r["all_match"]


def test_at_least_twenty_layouts_are_checked(built):
    """Counted from what Megatron built and compared, not from the list above."""
    checked = [lay for r in built.values() for lay in r["layouts"] if lay["ranks"] and "match" in lay]
    assert len(checked) >= 20
