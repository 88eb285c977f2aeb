"""The audit's part bounds (mcore_dapo_checks.audit_verdict) on one recorded update: the engine's rounding measured on
the same update widens the bound by how much further the engine's log-probs were from the fp32 reference's than the
bf16 recomputation's, and no further; a mutation counts as one the bound resolves only where the bound is sure to
reject it."""

from mcore_dapo_checks.audit_verdict import part_bound, part_misses, resolves, rounding_ratio

# one update of a synchronous EP2 run (TP2+SP x DP2, EP2 x EDP2, router replay R3; its second update):
# the engine's embeddings' gradient norm 3 % above the fp32 reference's, 4.6 times the bf16 recomputation's
# difference, while the engine's log-probs were 2.6 times as far from the fp32 reference's as the bf16 model's
UPDATE = {
    "engine_part_grad_norms": {"embeddings": 0.06515, "attention": 0.05399, "norms": 0.02082, "experts": 0.02844,
                               "routers": 0.00430, "output layer": 0.26853},
    "reference_part_grad_norms": {"embeddings": 0.06322, "attention": 0.05290, "norms": 0.02085, "experts": 0.02845,
                                  "routers": 0.00425, "output layer": 0.26901},
    "reference_bf16_part_grad_diff": {"embeddings": 0.00042, "attention": 0.00053, "norms": 0.00020,
                                      "experts": 0.00036, "routers": 0.00005, "output layer": 0.00355},
    "logprob_rms_diff": 4.30e-3, "reference_bf16_logprob_rms_diff": 1.64e-3,
}


def test_the_part_bounds_carry_the_engines_own_rounding_of_the_same_update():
    assert rounding_ratio(UPDATE) == 4.30e-3 / 1.64e-3
    assert part_misses(UPDATE) == []
    # the bf16 recomputation's rounding alone (the ratio left out): the embeddings miss, as they did in CI
    alone = {k: v for k, v in UPDATE.items() if k != "logprob_rms_diff"}
    assert rounding_ratio(alone) == 1.0 and part_misses(alone) == ["embeddings"]
    # an engine closer to fp32 than the bf16 model is held to the bf16 model's rounding, not a tighter one
    assert rounding_ratio({**UPDATE, "logprob_rms_diff": 1e-4}) == 1.0
    # the widened bound still rejects a wrong scale of any part at this update
    for part in UPDATE["engine_part_grad_norms"]:
        assert part_misses(UPDATE, {part: 1.3}) == [part], part
        assert part_misses(UPDATE, {part: 0.0}) == [part], part


# the update where a guard that took "room" as the bound under the mutation's whole shift failed (a separate_async
# pair's first update): attention's bound 0.0391, the engine's attention norm 0.1350, the reference's 0.1384
MISSED = {"engine_part_grad_norms": {"attention": 0.13497}, "reference_part_grad_norms": {"attention": 0.13844},
          "reference_bf16_part_grad_diff": {"attention": 0.0391084 / 3}}


def test_a_mutation_is_resolved_only_where_the_bound_is_sure_to_reject_it():
    assert part_misses(MISSED) == []
    # under the mutation's whole shift, yet accepted: the engine's own norm sat 2.5 % under the reference's
    assert part_bound(MISSED, "attention") < 0.3 * 0.13844 and part_misses(MISSED, {"attention": 1.3}) == []
    assert not resolves(MISSED, "attention", 1.3)
    assert resolves(MISSED, "attention", 2.0) and part_misses(MISSED, {"attention": 2.0}) == ["attention"]
    # wherever it says resolved, the mutation is rejected, the engine anywhere within its bound of the reference
    for scale in (0.0, 0.5, 0.8, 1.3, 2.0):
        for i in range(-10, 11):
            engine = 0.13844 + i / 10 * part_bound(MISSED, "attention")
            a = {**MISSED, "engine_part_grad_norms": {"attention": engine}}
            if resolves(a, "attention", scale):
                assert part_misses(a, {"attention": scale}) == ["attention"], (scale, engine)
