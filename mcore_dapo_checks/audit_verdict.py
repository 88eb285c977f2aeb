"""The audit's verdict on each update (the output of :func:`mcore_dapo_checks.audit_reference.reference`): its
tolerances, each argued beside its constant, and the checks that tests/test_verl_trainer.py (``check_audit``) and
``mcore-dapo tiny-dapo --audit`` apply to every update."""

from __future__ import annotations

# Tolerances of the audit (the bf16 engine, through verl's whole update path, against an fp32 HF reference of
# the same batch from the engine's weights of that step; mcore_dapo_checks.audit_reference):
# - loss, absolute: the token-mean of A * ratio with |A| <~ 2 over the mini-batch's ~50 response tokens (the
#   taught model answers in 3), where the engine's log-probs carry bf16 rounding (~1e-2 a token) and the
#   reference's do not: ~1e-2 * 2 / sqrt(50) ~ 3e-3 at most, as the per-token differences partly cancel;
#   measured <= 8.6e-4 in the synchronous runs, <= 1.2e-3 over the 8 updates of both asynchronous runs, and
#   2.3e-3 at one update of a later separate_async run: 5e-3. The aggregation itself is checked
#   apart and sharply: the engine's loss against verl's loss formula over the whole batch on the engine's own
#   log-probs of the update's forward (no rounding of the reference's in between): measured at most 2.2e-8 over 16 updates of
#   four runs (float32 sums in another order): 1e-5; a mis-scaled token-mean (per-rank tokens, a DP factor) is
#   off by the loss's whole size, 1e-3 to 6e-2 here.
# - weights after the update: Adam's first steps move each element by ~lr whatever the gradient's size, so a
#   gradient element within bf16's rounding of zero, whose sign bf16 flips, lands 2 lr away from the
#   reference. The share of elements more than one bf16 step from the reference's chained update stays under
#   10 % per update with a learning rate above 0 (measured 3 to 6 % after the first, up to 8.2 % after the
#   third), and no element is further than 2.5 * (sum of the learning rates so far) plus half the bf16
#   spacing at the largest weight (~1.2: 4e-3). A wrong learning rate, clip, weight decay or a stale weight
#   moves most elements (the update moves 65 to 86 %). The reference's chain runs twice, fed with the fp32 and
#   with the bf16 HF model's gradients (below): an element counts where it is beyond both. Mostly the same (the
#   two gradients thousandths apart); after an update whose gradient bf16 rounding moves wholly (below) the fp32
#   chain alone had 31.8 % of the elements beyond at update 4, both chains 15.4 %.
LOSS_ABS, BEYOND_PER_UPDATE, HALF_SPACING = 5e-3, 0.1, 4e-3
LOSS_AGGREGATION_ABS = 1e-5

# The audit's tolerances beyond those above, argued from the first measurements (2-core CPU):
# - per-token log-probs: the fp32 HF reference with the rollout's routes forced (R3) or the engine's, at the
#   weights the update starts from, against the engine's log-probs of the update's forward and, where verl
#   recomputed the old policy (not in bypass mode), its old log-probs (bf16 Megatron, the same weights, its
#   routes replayed): bf16's rounding of the logits over 8 MoE layers, relative to their size, so the check takes
#   |ref - engine| / (1 + |engine|) per token: near-certain tokens measured at most 2.8e-2 off, a token of
#   log-prob -11.5 0.040 off (scaled 1.4e-2, the largest scaled over 16 updates of four runs) -- 5e-2. A token
#   whose experts were mixed up in the replay path (every expert index moved by one: scaled 0.10 to 0.27 over 8
#   updates), or whose data-parallel share went to another rank, is off by tenths to units.
# - the importance weights verl's rollout correction gave the update (min(pi_old / pi_rollout, 2.0) per token)
#   against the same ratio computed here from the engine's pi_old (checked above) and the rollout's own log-probs:
#   equal in every update measured (0.0 over 16 updates): float rounding, 1e-5. The rollout's log-probs moved
#   by 0.1 move the weights by about 0.1.
# - the loss: against the fp32 reference within LOSS_ABS above, which holds a loss of about 0 (one on-policy
#   mini-batch whose answers all have the same length is 0 by construction); the sharp check is the aggregation's
#   (LOSS_AGGREGATION_ABS above), which a loss doubled, halved or divided by another token count fails at any update
#   whose loss is above 1e-3 (every run has one: the largest measured 1.2e-2 to 6e-2).
# - each part's gradient (embeddings, output layer, attention, norms, routers, experts): the whole model's norm is
#   mostly the embeddings' and the output layer's, so a wrong scale inside the layers (experts doubled: a doubled or
#   missing 1/expert-DP scaling) barely moves it. Each part of the engine's gradient norm must be within BF16_SPREAD
#   times how far bf16 rounding alone moves that part at that update, measured on the HF model
#   (audit_reference.reference): the fp32 gradient against the bf16 model's, and against four more bf16 draws whose
#   embeddings' output is moved within one bf16 spacing (a forward rounded otherwise at every later step); the largest
#   of the five differences. One draw is no measure: at one update the five spread 3 to 7 times (embeddings 0.014 to
#   0.099 of the part), and the engine's own rounding is one more draw: bounds from the unperturbed draw alone failed
#   3 of 7 vLLM trainer runs (once in CI), at that update the engine's 0.051 against the draw's 0.014; the largest
#   draw bounds every update of those runs at most a third of the way (docs/BENCHMARKS.md, "The audit's rounding
#   draws"). Where the batch's gradient is a small remainder of the sequences' (a group's answers
#   alike, advantages summing to 0) or runs through near-saturated attention, rounding moves it by a quarter of
#   itself, and nothing finer can be told there. The engine (other kernels, bf16 collectives) rounds more than the HF
#   model at some updates: its log-probs were up to 4.2 times as far from the fp32 reference's, and the bound scales
#   by that ratio measured at the same update (rounding_ratio, at least 1). A wrong scale of a part moves its norm by
#   the scale, not by rounding; a forward wrong beyond rounding fails the log-probs check (LOGPROB_TOL) first. No
#   absolute floor (a part zeroed, a router replay that kills the router's gradient, is off by its whole norm) and no
#   share of past samples. The engine's part norms are read from the gradients Megatron's optimizer counts in its
#   grad norm (audit.PartGradNorms): their root-sum-square is the grad norm Megatron reported (PARTS_RSS_REL).
LOGPROB_TOL, IS_WEIGHT_ABS, BF16_SPREAD = 5e-2, 1e-5, 3.0
# - the routes the reference is forced to: the rollout's where the engine replays them (R3), else those the engine's
#   routers chose in the update's forward (the audit keeps them). An fp32 reference routing by itself is not a
#   reference for a bf16 engine: a token whose router scores tie within the engine's rounding takes other experts.
#   Forced, each (token, layer) whose forced experts are not the fp32 router's own choice must be a near-tie by the
#   reference's own logits: the logit gap the choice would need (the largest left-out own choice less the smallest
#   forced newcomer) at most NEAR_TIE_RATIO times how far bf16 rounding moved that token's router logits (the largest
#   of the update's five bf16 draws, audit_reference.near_ties): each of the two logits may move by BF16_SPREAD times
#   that shift in the engine, as its gradients do (above). A router with a per-expert bias, or routes of other experts,
#   is not near any tie. How many routes differ is not held to a share: that is the batch's, how many of its routes
#   lie within rounding's reach. One Ascend-line trainer run (`python -m
#   mcore_dapo_checks.audit_reference RUN/audit`): 4 to 44 of an update's 960 routes within twice the bf16 shift
#   (routes_within_rounding), the engine's own routes differing from the fp32 router's at 0 to 12 of them, each a
#   near-tie within 1.27 of the shift; a share floor of 0.99 (one near-tie in two hundred, from the first runs) failed
#   two of those four updates (12 of 960). Expert 0's logit raised (`--route-bias 0.01 0.02 0.05 0.1` on that run):
#   by 0.05 the near-tie ratio reached 9 to 16 at each update, by 0.1 (2 to 3 % of the routes moved) 25 to 36; a
#   raise of 0.01 moved 4 to 7 routes within 2.6 of the shift, which no routing check can tell from rounding. Under R3
#   the routes are the rollout's, chosen by the weights that generated the samples: in the asynchronous modes up to
#   max_off_policy_threshold - 1 versions older than the update's, and a tiny model's router moves at lr 1e-3
#   (measured: 0.9955 agreement and near-ties within 4.4 at the fresh updates of a separate_async R3 run, beyond any
#   tie at its updates of older samples), so there the near-ties are reported (routes_tie_ratio_max,
#   routes_native_agreement), not held.
# - the engine's own router logits (kept with its routes, where nothing is replayed): a bias small enough to move
#   only near-ties (2 % of the routes in a batch with many of them: one run moved 2.2 % at a gap 3.9 times the shift)
#   is within the near-tie rule, so two more checks look where the bias is. Every kept route must be a top-k of the
#   logits the engine's router chose it from (exact, ties allowed): a bias, mask or other index where the experts are
#   picked fails it. And per MoE layer and expert, the mean over the batch's tokens of the engine's logit less the fp32
#   router's must be at most ROUTER_LOGIT_OFFSET times the mean shift of those tokens (near_ties): rounding moves a
#   token's logits both ways and averages out (measured 0.08 to 0.36 over the 20 updates of three vLLM and two
#   Ascend-line runs), a per-expert bias in the router's output moves one expert's logit the same way at every token (a raise of
#   0.01, under the shift of many tokens, measured 1.3 to 1.4; 0.1, which moved 3 to 4 % of the routes, 12 to 14).
NEAR_TIE_RATIO = 2 * BF16_SPREAD
ROUTER_LOGIT_OFFSET = 1.0
PARTS_RSS_REL = 1e-3
# the mutations each audited run must be able to reject: a part's engine norm scaled (experts x2 and x0.5: a doubled
# or missing expert-DP scaling, a missing expert-DP reduction leaving each of the two expert-DP ranks its own half of
# the batch, about x0.5; attention x2: a tensor-parallel reduction done twice; the routers' gradient zeroed, a replay
# that kills it), and every part x1.3. A bound resolves a mutation at an update where the mutation moves the engine's
# norm by more than twice the bound (resolves(): the engine within the bound of the reference, the mutated norm is
# then beyond it); each run must have such an update for each mutation, and the mutation is rejected there. Where bf16
# rounding moves a part by a third of its norm (a tiny model's near-zero gradients: one A2 vLLM run's attention at its
# warm-up update, 0.36), no bound derived from rounding resolves a x1.3 of it; a "room" taken as the bound under the
# mutation's whole shift missed x1.3 at an update where the engine's own norm sat 2.5 % under the reference's.
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
