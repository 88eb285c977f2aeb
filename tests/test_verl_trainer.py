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


def test_every_update_matches_the_hf_reference(tiny_run):
    # each step's batch and pre-update weights, recomputed in one process on the HF model (its routers
    # forced to the routes the update replayed): verl's micro-batching and loss scaling, Megatron's
    # schedules, EP all-to-all, DDP and bf16 agree
    steps, _, audit, _ = tiny_run
    assert len(audit) == STEPS
    for a in audit:
        assert a["engine_grad_norm"] == pytest.approx(a["reference_grad_norm"], rel=1e-2), a


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
