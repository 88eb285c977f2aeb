"""Megatron's distributed optimizer (use_distributed_optimizer=True, verl's default) on the CPU: two
identical Adam steps of the tiny Qwen3-MoE in Megatron's DDP, from get_megatron_optimizer with verl's
OptimizerConfig, give the parameters and grad norms of the plain optimizer, with the Adam state
sharded over the data-parallel ranks; a resume from verl's checkpoint format restores it bit for bit.
2 processes under gloo (mcore_dapo_checks.dist_optimizer).

Why the tolerances are tight. Both models start from the same weights and see the same batches, so
forward and backward are the same computation. The data-parallel gradient reduction is an all-reduce
for the plain optimizer and a reduce-scatter for the distributed one; over 2 ranks each element is a
single addition of two addends, which IEEE arithmetic makes order-independent, so the reduced
gradients are bit-identical. The grad norm is summed in another order (whole tensors, vs. per-rank
shards then all-reduced): a relative difference of a few fp32 roundings (seen: 6e-8), asserted below
1e-6. That norm sets the clip coefficient (clip_grad=1.0, the norm is above 1), so the clipped
gradients differ by about one fp32 rounding; Adam divides the gradient scale out (m / sqrt(v), up to
eps=1e-8), so the updated fp32 parameters differ by a few fp32 ulps at most (seen: 0 in bf16, 1.6e-7
after two fp32 steps), asserted below 1e-6, a thousandth of the learning rate (1e-3), which Adam's
first steps move almost every weight by: a shard updated from an unreduced gradient, twice, or not
at all would be off by ~1e-4 or more. bf16 model parameters are the bf16 roundings of those, within
one bf16 step (2**-7 relative) where the fp32 values straddle a rounding boundary.
"""

import pytest

from mcore_dapo.runtime.launch import torchrun

# 2 torchrun ranks through the device adapter alone (gloo on the CPU; on an accelerator host one device a rank)
pytestmark = pytest.mark.ranks(2)

LR = 1e-3
CASES = {
    # EP2 on 2 ranks: dense parameters are data-parallel over both ranks (DP2), experts are not (expert DP1)
    "ep2-bf16": ["--ep", "2", "--dtype", "bf16"],
    # EP1: every parameter, experts included, data-parallel over both ranks; fp32 model, fp32 optimizer path
    "ep1-fp32": ["--ep", "1", "--dtype", "fp32"],
}


@pytest.fixture(scope="module", params=list(CASES))
def compared(request, tiny_moe, tmp_path_factory):
    args = ["--hf-path", str(tiny_moe), "--steps", "2", "--lr", str(LR), *CASES[request.param]]
    if request.param == "ep2-bf16":  # verl's setting: its checkpoint format saved, loaded by a fresh optimizer
        args += ["--checkpoint", str(tmp_path_factory.mktemp("dist-opt") / "optimizer")]
    return request.param, torchrun("mcore_dapo_checks.dist_optimizer", args, 2, timeout=600)


def test_the_optimizers_are_megatrons_distributed_and_plain(compared):
    case, got = compared
    assert got["device"] == "cpu" and got["world_size"] == 2 and got["dp_size"] == 2
    assert got["expert_dp_size"] == (1 if case == "ep2-bf16" else 2)
    plain = "Float16OptimizerWithFloat16Params" if case == "ep2-bf16" else "FP32Optimizer"
    for r in got["ranks"]:
        assert set(r["optimizers"]["distributed"]) == {"DistributedOptimizer"}
        assert set(r["optimizers"]["plain"]) == {plain}


def test_grad_norms_and_losses_are_equal(compared):
    _, got = compared
    for d, p in zip(got["steps"]["distributed"], got["steps"]["plain"], strict=True):
        assert d["update_successful"] and p["update_successful"]
        assert d["grad_norm"] > 1.0  # clip_grad=1.0 acted
        assert d["grad_norm"] == pytest.approx(p["grad_norm"], rel=1e-6, abs=0)
    first_d, first_p = got["steps"]["distributed"][0], got["steps"]["plain"][0]
    assert first_d["loss"] == first_p["loss"]  # the same weights, the same batch: the same forward
    assert got["steps"]["distributed"][1]["loss"] == pytest.approx(got["steps"]["plain"][1]["loss"], rel=1e-6)


def test_updated_parameters_are_equal(compared):
    case, got = compared
    for r in got["ranks"]:
        assert r["fp32_moved"] > 0.9 * r["fp32_numel"]  # the two steps moved (almost) every fp32 weight
        assert r["fp32_max_abs_diff"] < 1e-6, r["fp32_worst"]
        if case == "ep2-bf16":
            assert r["model_max_rel_diff"] <= 2.0 ** -7  # bf16 model weights: one bf16 step at most
        else:
            assert r["model_max_abs_diff"] < 1e-6  # the fp32 model's weights are the optimizer's
    # every fp32 element was compared: the ranks' shards of a data-parallel parameter make it whole
    for kind in ("dense", "expert"):
        numel = got["ranks"][0]["numel"][kind]
        shared = kind == "dense" or got["expert_dp_size"] == 2
        seen = [r["fp32_compared"][kind] for r in got["ranks"]]
        assert (sum(seen) if shared else min(seen)) == numel


def test_adam_state_is_sharded_over_the_data_parallel_ranks(compared):
    _, got = compared
    for kind in ("dense", "expert"):
        numel = got["ranks"][0]["numel"][kind]
        sharded = kind == "dense" or got["expert_dp_size"] == 2
        held = [r["adam_state_distributed"][kind] for r in got["ranks"]]
        for r in got["ranks"]:
            assert r["adam_state_plain"][kind] == 2 * numel  # exp_avg and exp_avg_sq of every element
        if not sharded:  # expert DP1: each rank's own experts, whole, as with the plain optimizer
            assert held == [2 * numel] * 2
            continue
        assert sum(held) == 2 * numel  # the shards partition the state
        for h in held:  # about half each: Megatron's buffers split evenly, padding apart
            assert abs(h - numel) <= 0.01 * numel
    assert got["ranks"][0]["numel"]["dense"] > 0


def test_a_resume_restores_the_distributed_optimizer_bit_for_bit(compared):
    """torch_dist through Megatron's dist_checkpointing, in the format verl's checkpoint manager asks for
    (fully_sharded_model_space before megatron-core 0.14, dp_reshardable from 0.14), loaded into the optimizer
    of a freshly built model: every rank's fp32 main-parameter shards, Adam moments and step as saved."""
    case, got = compared
    if case != "ep2-bf16":
        pytest.skip("the checkpoint round trip runs in verl's setting (bf16) only")
    for r in got["ranks"]:
        trip = r["checkpoint_round_trip"]
        assert trip["compared"] > 100 and trip["differ"] == [], trip
        assert trip["state_keys"] == ["exp_avg", "exp_avg_sq", "step"]  # torch's AdamW (no Apex, no TE)
