"""verl's own DAPO trainer end to end on the CPU (python -m mcore_dapo.verl_plugin.main_dapo): Ray,
the v1 sync trainer, the agent loop with the plugin's hf_cpu rollout, the dapo reward manager,
dynamic sampling (filter_groups), the plugin's Megatron engine (EP2, 2 processes), weight sync;
router replay R3 (the rollout's routed experts, through the agent loop and TransferQueue, replayed
in the old-log-prob pass and the update)."""

import math

import pytest

pytestmark = pytest.mark.cpu_only  # torchrun ranks of real Megatron on one host, gloo

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

STEPS = 3


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from mcore_dapo import megatron_compat
    from mcore_dapo.harness.tiny_dapo import read_metrics, run

    work = tmp_path_factory.mktemp("tiny-dapo")
    # R3 where Megatron has routing replay (0.16 on); the same run without replay options on the 0.12.1 line
    replay = "R3" if megatron_compat.supports_routing_replay() else None
    result = run(work, STEPS, timeout=1200, audit=True, router_replay=replay)
    log_tail = "\n".join((work / "train.log").read_text(errors="replace").splitlines()[-40:])
    assert result["returncode"] == 0, log_tail
    return [r["data"] for r in read_metrics(work / "metrics.jsonl")], log_tail, result["audit"], work


def test_trainer_runs_the_steps_on_megatron(tiny_run):
    steps, log, *_ = tiny_run
    assert len(steps) == STEPS, log
    for m in steps:
        assert math.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0
        assert m["actor/lr"] == pytest.approx(1e-3)
        assert "timing_s/update_actor" in m and "timing_s/gen" in m


def test_rollout_holds_the_trained_weights_every_step(tiny_run):
    # verl compares the rollout's log-probs (HF model on the CPU, weights synced from Megatron after
    # every update) with the actor's recomputation on Megatron: equal weights -> bf16 noise only
    steps, *_ = tiny_run
    for m in steps:
        assert m["training/rollout_probs_diff_valid"] == 1.0
        assert m["training/rollout_probs_diff_max"] < 5e-3
        assert m["training/rollout_actor_probs_pearson_corr"] > 0.999


def test_dapo_pieces_act(tiny_run):
    steps, *_ = tiny_run
    assert sum(m.get("training/filter_groups/evicted_samples", 0) for m in steps) > 0  # dynamic sampling
    assert min(m["critic/score/min"] for m in steps) < -1.0  # overlong penalty of the dapo reward manager


# Tolerances of the audit (the bf16 engine, through verl's whole update path, against an fp32 HF reference of
# the same batch from the engine's weights of that step; mcore_dapo.harness.audit_reference):
# - loss, absolute: the token-mean of A * ratio with |A| <~ 2, where the engine's log-probs carry bf16 rounding
#   (~1e-2 a token) and the reference's do not: ~1e-2 * 2 / sqrt(180 tokens) ~ 1.5e-3; measured <= 1.8e-4. The
#   loss itself is ~0.03; a mis-scaled token-mean (per-rank tokens, a DP factor) is off by its whole size.
# - grad norm, relative: bf16 gradients summed over ~330k parameters; measured <= 6e-4.
# - weights after the update: Adam's first steps move each element by ~lr whatever the gradient's size, so a
#   gradient element whose sign bf16 flips lands 2 lr away. Per step k (1-based) the share of elements more
#   than one bf16 step from the reference's chained update stays under 3 % * k (measured 0.5, 3.0, 4.6 %), and
#   no element is further than 2.5 * (sum of the learning rates so far) plus half the bf16 spacing at the
#   largest weight (~1.2: 4e-3). A wrong learning rate, clip, weight decay or a stale weight moves most
#   elements (the update moves ~90 %).
LOSS_ABS, GRAD_NORM_REL, BEYOND_PER_STEP, HALF_SPACING = 2e-3, 5e-3, 0.03, 4e-3


def test_every_update_matches_the_hf_reference(tiny_run):
    # each step's batch and pre-update weights, recomputed in one process on the HF model (its routers
    # forced to the routes the update replayed): verl's micro-batching and loss scaling, Megatron's
    # schedules, EP all-to-all, DDP, optimizer and bf16 agree; the optimizer step is chained on the reference
    steps, _, audit, _ = tiny_run
    assert len(audit) == STEPS
    lr_sum = 0.0
    for k, a in enumerate(audit, start=1):
        assert a["engine_loss"] == pytest.approx(a["reference_loss"], abs=LOSS_ABS), a
        assert a["engine_grad_norm"] == pytest.approx(a["reference_grad_norm"], rel=GRAD_NORM_REL), a
        lr_sum += a["lr"]
        assert a["weights_beyond_one_step"] < BEYOND_PER_STEP * k, a
        assert a["weights_max_abs_diff"] < 2.5 * lr_sum + HALF_SPACING, a
        if a["lr"] > 0:  # under warm-up the first step's learning rate is 0 (Megatron's schedule starts there)
            assert a["weights_moved"] > 0.5, a


def test_r3_replays_the_rollout_routing_through_the_trainer(tiny_run, capsys):
    from mcore_dapo import megatron_compat

    if not megatron_compat.supports_routing_replay():
        pytest.skip("this megatron-core has no routing replay (from 0.16.0): the run trained without it")
    # the rollout's routed experts reach the engine through the agent loop and TransferQueue: the
    # routers' top-k sets equal them for every (token, layer), in the old-log-prob pass and the update
    steps, _, audit, work = tiny_run
    for m in steps:
        assert m["actor/routing/rollout_agreement"] == 1.0 and m["actor/routing/replay_agreement"] == 1.0
    # what the update replayed: per sample [tokens - 1 (the last token is never fed back), layers, top-k]
    for a in audit:
        assert a["forced_routes"] and all(r[1:] == [4, 2] for r in a["forced_routes"]), a
    from mcore_dapo.cli.main import main

    assert main(["metrics", str(work / "train.log"), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "actor/routing/rollout_agreement" in out and "route agr" in out
