"""The audit's verdict on each update (the output of :func:`mcore_dapo_checks.audit_reference.reference`): its
tolerances, each argued beside its constant, and the checks that tests/test_verl_trainer.py (``check_audit``) and
``mcore-dapo tiny-dapo --audit`` apply to every update."""

from __future__ import annotations

# Each tolerance holds the bf16 engine, through verl's whole update path, against an fp32 HF reference of the same
# batch from the engine's weights of that step (audit_reference.reference). Figures: docs/BENCHMARKS.md, "The audit's
# rounding draws" and "The audit's routing checks and the bypass run".

# loss, absolute: a token-mean of A * ratio (|A| <~ 2, ~50 response tokens) whose log-probs the engine rounds (~1e-2
# a token): ~1e-2 * 2 / sqrt(50) ~ 3e-3 at most (measured up to 2.3e-3). It holds a loss of about 0; the sharp check:
LOSS_ABS = 5e-3
# the aggregation: verl's loss formula on the engine's own log-probs of the update's forward, where only the order of
# float32 sums differs (measured at most 2.2e-8); a loss doubled, halved or over another token count is off by its size.
LOSS_AGGREGATION_ABS = 1e-5
# weights after the update: Adam's first steps move each element by ~lr, so one whose gradient sign bf16 flips lands
# 2 lr away. Under 10 % of the elements more than one bf16 step from the reference's chained update (counted where
# beyond both the fp32 and the bf16 chain; measured 3 to 8.2 %; a wrong lr, clip, weight decay or stale weight moves
# 65 to 86 %); none further than 2.5 x the learning rates so far + half the bf16 spacing at the largest weight (~1.2).
BEYOND_PER_UPDATE, HALF_SPACING = 0.1, 4e-3
# per-token log-probs, |ref - engine| / (1 + |engine|): bf16 rounding of the logits over 8 MoE layers relative to their
# size (largest measured 1.4e-2); experts mixed up in the replay path are off by 0.10 to 0.27, another rank's share by units.
LOGPROB_TOL = 5e-2
# the importance weights verl gave the update against min(pi_old / pi_rollout, 2) computed here: equal up to float
# rounding (measured 0.0); the rollout's log-probs moved by 0.1 move them by about 0.1.
IS_WEIGHT_ABS = 1e-5
# each part's gradient norm (embeddings, output layer, attention, norms, routers, experts; the whole norm is mostly the
# embeddings' and the output layer's, so a wrong scale inside the layers barely moves it): within BF16_SPREAD times how
# far bf16 rounding moves that part at that update on the HF model (the largest of five bf16 draws against fp32: the
# draws spread up to 7 times, the engine's rounding is one more), scaled by the engine's own rounding ratio
# (rounding_ratio, at least 1). A wrong scale moves a part by the scale; no absolute floor (a zeroed part is off by its
# whole norm). The engine's part norms are those Megatron's optimizer counts: their root-sum-square is its grad norm.
BF16_SPREAD = 3.0
PARTS_RSS_REL = 1e-3
# forced routes (the rollout's under R3, else the engine's own): each (token, layer) whose forced experts are not the
# fp32 router's own choice must be a near-tie, the logit gap that choice would need at most NEAR_TIE_RATIO times how far
# bf16 moved the token's router logits (each of the two logits may move BF16_SPREAD times the shift). Not held to a
# share (how many routes lie within rounding's reach is the batch's); under R3 in the asynchronous modes the routes come
# from older weights, so there the near-ties are reported (routes_tie_ratio_max), not held.
NEAR_TIE_RATIO = 2 * BF16_SPREAD
# the engine's own router logits, where nothing is replayed: per MoE layer and expert, the mean offset from the fp32
# router's over the batch's tokens, in units of their mean bf16 shift. Rounding averages out (measured 0.08 to 0.36); a
# per-expert bias in the router's output does not (a raise of 0.01: 1.38 and 1.62; 0.1: 12.5 and 13.3). A bias where
# the experts are picked fails the exact check that every kept route is a top-k of the logits it was chosen from.
ROUTER_LOGIT_OFFSET = 1.0
# the mutations each audited run must be able to reject: experts x2 and x0.5 (a doubled or missing expert-DP scaling or
# reduction), attention x2 (a tensor-parallel reduction done twice), the routers' gradient zeroed (a replay that kills
# it) and every part x1.3; each at an update where it moves the engine's norm by more than twice the bound (resolves()).
PART_MUTATIONS = ({"experts": 2.0}, {"experts": 0.5}, {"attention": 2.0}, {"routers": 0.0})
EVERY_PART_SCALE = 1.3


def rounding_ratio(a: dict) -> float:
    """How much further the engine's rounding moved this update's log-probs from the fp32 reference's than the bf16
    recomputation's did (root-mean-square over the batch's response tokens; the largest of its draws,
    audit_reference.reference), at least 1: the yardstick of the part bounds (:func:`part_bound`) is the bf16
    recomputation's rounding, and the engine's own is measured on the same update against it. Audits recorded before
    both figures existed: 1."""
    engine, bf16 = a.get("logprob_rms_diff"), a.get("reference_bf16_logprob_rms_diff")
    if engine is None or not bf16:
        return 1.0
    return max(1.0, engine / bf16)


def part_bound(a: dict, part: str) -> float:
    """How far the engine's gradient norm of ``part`` may be from the reference's at one audited update."""
    return BF16_SPREAD * rounding_ratio(a) * a["reference_bf16_part_grad_diff"][part]


def part_misses(a: dict, scale: dict | None = None) -> list[str]:
    """The parts whose engine gradient norm (times ``scale[part]``, a mutation) is beyond its bound."""
    scale = scale or {}
    return [p for p, ref in a["reference_part_grad_norms"].items()
            if abs(a["engine_part_grad_norms"][p] * scale.get(p, 1.0) - ref) > part_bound(a, p)]


def resolves(a: dict, part: str, scale: float) -> bool:
    """Whether ``part``'s bound at update ``a`` is sure to reject the engine's norm of it times ``scale``: the scale
    moves the norm by more than twice the bound, so with the engine within the bound of the reference the scaled norm
    is beyond it."""
    return abs(scale - 1) * a["engine_part_grad_norms"][part] > 2 * part_bound(a, part)


def update_misses(a: dict, lr_sum: float, updates: int) -> list[str]:
    """The checks one audited update fails ([] when it passes); ``lr_sum``, ``updates``: the learning rates so far and
    how many updates had one above 0, this one included (the weights' bounds grow with them)."""
    miss = []
    if a.get("optimizer_source") != "launch" or a.get("optimizer_failures"):
        miss.append("optimizer settings")
    if a["engine_loss"] is None or abs(a["engine_loss"] - a["loss_at_engine_log_probs"]) >= LOSS_AGGREGATION_ABS:
        miss.append("loss aggregation")
    elif abs(a["engine_loss"] - a["reference_loss"]) > LOSS_ABS:
        miss.append("loss")
    if not a["forced_routes"]:
        miss.append("routes not forced")
    if a.get("routes_from") == "engine":  # routes of the update's own weights (under R3: see NEAR_TIE_RATIO)
        if a.get("routes_tie_ratio_max") is None or a["routes_tie_ratio_max"] > NEAR_TIE_RATIO:
            miss.append("near-ties")
        if a.get("routes_not_engine_top_k") is None or a["routes_not_engine_top_k"] > 0:
            miss.append("routes not the engine's top-k")
        if a.get("router_logit_offset_max") is None or a["router_logit_offset_max"] > ROUTER_LOGIT_OFFSET:
            miss.append("router logits")
    engine = a.get("engine_part_grad_norms") or {}
    rss = sum(v * v for v in engine.values()) ** 0.5
    if not engine or set(engine) != set(a["reference_part_grad_norms"]) or \
            abs(rss - a["engine_grad_norm"]) > PARTS_RSS_REL * a["engine_grad_norm"]:
        miss.append("gradient parts")
    else:
        miss += [f"gradient: {p}" for p in part_misses(a)]
    if a["logprob_max_scaled_diff"] >= LOGPROB_TOL:
        miss.append("log-probs")
    if a.get("is_weights_vs_engine_max_abs_diff", 0.0) >= IS_WEIGHT_ABS:
        miss.append("importance weights")
    if "old_vs_rollout_max_abs_diff" in a and a["old_vs_rollout_max_abs_diff"] != 0.0:
        miss.append("bypass: old log-probs not the rollout's")
    if "weights_beyond_one_step" in a:
        if a["weights_beyond_one_step"] > BEYOND_PER_UPDATE * updates or \
                a["weights_max_abs_diff"] >= 2.5 * lr_sum + HALF_SPACING:
            miss.append("weights")
        moved = a["weights_moved"] > 0.5 if a["lr"] > 0 else a["weights_moved"] == 0.0 and a["weights_max_abs_diff"] == 0.0
        if not moved:
            miss.append("weights moved")
    return miss


def verdicts(audit: list[dict]) -> list[list[str]]:
    """:func:`update_misses` of every update, in order."""
    out, lr_sum, updates = [], 0.0, 0
    for a in audit:
        lr_sum += a.get("lr") or 0.0
        updates += (a.get("lr") or 0.0) > 0
        out.append(update_misses(a, lr_sum, updates))
    return out
