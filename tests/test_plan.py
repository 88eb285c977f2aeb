"""The planner without Megatron: enumeration, Megatron's layer placement, counts, memory, ranking, the CLI."""

import json
import re
from pathlib import Path

import pytest

from mcore_dapo.bridge import Layout, load_hf_config
from mcore_dapo.cli.analysis import main as cli
from mcore_dapo.errors import UserError
from mcore_dapo.plan import PlanLayout, Workload, enumerate_layouts, get_device, model_params, plan, rank_params
from mcore_dapo.plan.memory import estimate_memory
from mcore_dapo.plan.planner import evaluate


@pytest.fixture(scope="module")
def cfg(reference_config):
    return load_hf_config(reference_config)


def test_model_size_is_the_published_one(cfg):
    total, active = model_params(cfg)
    assert round(total / 1e9, 1) == 30.5  # Qwen3-30B-A3B: 30.5B parameters
    embedding = cfg.vocab_size * cfg.hidden_size
    assert 3.3 <= (active + embedding) / 1e9 < 3.4  # 3.3B activated


def test_the_shards_add_up_to_the_model(cfg):
    lay = PlanLayout(Layout(tp=1, pp=4, ep=8, etp=1))
    per_stage = [rank_params(cfg, lay, r) for r in range(4)]
    total, _ = model_params(cfg)
    assert sum(p.dense for p in per_stage) + 8 * sum(p.expert for p in per_stage) == total


@pytest.mark.parametrize("pp,vpp,first,last,expected", [
    # Megatron's docstring: 8 layers, 2 stages, 2 virtual stages
    (2, 2, None, None, [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]),
    (2, 4, None, None, [[[0], [2], [4], [6]], [[1], [3], [5], [7]]]),
    (3, None, 2, 2, [[[0, 1]], [[2, 3, 4, 5]], [[6, 7]]]),
    (3, None, None, 2, [[[0, 1, 2]], [[3, 4, 5]], [[6, 7]]]),
    (3, 2, 2, 2, [[[0], [4]], [[1, 2], [5, 6]], [[3], [7]]]),
])
def test_layer_placement_follows_megatron(pp, vpp, first, last, expected):
    pl = PlanLayout(Layout(pp=pp, vpp=vpp), first, last)
    assert [pl.chunks(8, r) for r in range(pp)] == expected


def test_every_enumerated_layout_is_legal_and_the_anchors_are_there(cfg):
    layouts = enumerate_layouts(cfg, 32)
    for pl in layouts:
        pl.validate(cfg, 32)
        assert pl.layout.dp(32) * pl.layout.tp * pl.layout.pp * pl.layout.cp == 32
    names = {pl.describe() for pl in layouts}
    for anchor in ("TP1 PP1 EP8 ETP1", "TP4 PP1 EP8 ETP1", "TP4 PP2 EP4 ETP1", "TP2 PP2 EP4 ETP1 VPP2"):
        assert anchor in names
    assert any(pl.first is not None for pl in layouts)


def test_a_pipeline_that_does_not_divide_the_layers_gets_uneven_stages(cfg):
    sevens = [pl for pl in enumerate_layouts(cfg, 56) if pl.layout.pp == 7]
    assert sevens and all(pl.first is not None and pl.last is not None for pl in sevens)
    for pl in sevens:
        assert sum(len(c) for r in range(7) for c in pl.chunks(48, r)) == 48


def test_optimizer_state_is_sharded_over_data_parallel(cfg):
    w = Workload(get_device("h100"), nodes=4)
    small = estimate_memory(cfg, PlanLayout(Layout(tp=2, ep=8, etp=1)), w)[0]  # expert-DP 4
    big = estimate_memory(cfg, PlanLayout(Layout(tp=2, ep=4, etp=1)), w)[0]  # expert-DP 8
    assert big.params > small.params  # twice the experts per rank...
    assert big.optimizer == pytest.approx(small.optimizer, rel=0.05)  # ...sharded over twice the ranks


def test_offload_changes_the_rollout_phase_only(cfg):
    pl = PlanLayout(Layout(tp=2, ep=8, etp=1))
    none, full = (estimate_memory(cfg, pl, Workload(get_device("a2"), nodes=4, offload=o))[0]
                  for o in ("none", "param+optimizer"))
    assert none.update_total == full.update_total
    assert full.rollout_total == pytest.approx(0.5 * 64.0 + full.overhead)
    assert none.rollout_total > full.rollout_total


def test_recompute_shrinks_activations(cfg):
    pl = PlanLayout(Layout(tp=2, ep=8, etp=1))
    acts = {r: estimate_memory(cfg, pl, Workload(get_device("h100"), nodes=4, recompute=r))[0].activations
            for r in ("none", "selective", "full")}
    assert acts["full"] < acts["selective"] < acts["none"]


def test_ranking_puts_fitting_fast_layouts_first(cfg):
    ranked = plan(cfg, Workload(get_device("h100"), nodes=4))
    fits = [c.fits for c in ranked]
    assert fits.index(False) > 0 and all(fits[: fits.index(False)])
    fitting = [round(c.time.total_s, 3) for c in ranked if c.fits]
    assert fitting == sorted(fitting)


def test_the_pipeline_bubble_shrinks_with_virtual_stages(cfg):
    w = Workload(get_device("h100"), nodes=4)
    plain = evaluate(cfg, PlanLayout(Layout(tp=2, pp=4, ep=4, etp=1)), w).time
    inter = evaluate(cfg, PlanLayout(Layout(tp=2, pp=4, ep=4, etp=1, vpp=2)), w).time
    assert inter.bubble_s == pytest.approx(plain.bubble_s / 2)


def test_plan_cli_json(reference_config, capsys):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8",
                "--device", "h200", "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["candidates"]) == 3 and out["best"] == out["candidates"][0]["layout"]
    assert out["device"]["bf16_tflops"] == 989.0 and "source" in out["device"]
    over = out["candidates"][0]["overrides"]
    assert any(o.startswith("actor_rollout_ref.actor.megatron.expert_model_parallel_size=") for o in over)


def test_plan_cli_table(reference_config, capsys):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8",
                "--device", "a2", "--offload", "param+optimizer", "--gpu-memory-utilization", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "verl overrides for the best layout" in out
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=" in out
    assert "trainer modes (a model from measured phases: the guide's step 9" in out  # plan/modes.py
    assert "generation (a model: " in out and "generation time not modelled" not in out
    assert re.search(r"best rollout layout: GEN_TP=\d GEN_DP=\d GEN_EP=\d+ ENFORCE_EAGER=(True|False) "
                     r"\(\d+\.\d s projected generation\)", out)
    assert all(f"  {m} " in out for m in ("sync", "colocate_async", "separate_async")) and "  best: " in out


def test_nothing_fits_says_so(reference_config, capsys):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "1", "--devices-per-node", "2",
                "--device", "a2"]) == 0
    assert "no layout fits" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--device", "tpu9"], "device='tpu9' is not known: accepted are h100, h200"),
    (["--device", "h100", "--recompute", "some"], "recompute='some' is not accepted: accepted are full"),
    (["--device", "h100", "--offload", "grads"], "offload='grads' is not accepted"),
    (["--device", "h100", "--gpu-memory-utilization", "1.5"], "gpu_memory_utilization=1.5 is not accepted"),
    (["--device", "h100", "--micro-batch-tokens", "100"], "micro_batch_tokens=100 is not accepted"),
])
def test_bad_plan_input_is_one_line(reference_config, capsys, args, needle):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_unknown_device_raises_user_error():
    with pytest.raises(UserError, match="accepted are"):
        get_device("tpu9")


def test_cp_variants_that_gain_nothing_are_left_out_unless_asked(reference_config, capsys):
    base = ["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8", "--device", "h100",
            "--top", "40", "--json"]
    assert cli(base) == 0
    listed = json.loads(capsys.readouterr().out)
    assert cli([*base, "--all"]) == 0
    everything = json.loads(capsys.readouterr().out)
    assert listed["listed_layouts"] < everything["listed_layouts"] == everything["legal_layouts"]
    assert any(c["cp"] > 1 for c in everything["candidates"])
    assert listed["best"] == everything["best"]


def test_layout_overrides_use_megatrons_names():
    from mcore_dapo.plan.planner import layout_overrides, stage_overrides

    pl = PlanLayout(Layout(tp=2, pp=3, ep=4, etp=1), 2, None)
    assert stage_overrides(pl) == {"num_layers_in_first_pipeline_stage": 2}
    actor = "actor_rollout_ref.actor.megatron"
    out = layout_overrides(pl)
    assert out[:6] == [f"{actor}.tensor_model_parallel_size=2", f"{actor}.pipeline_model_parallel_size=3",
                       f"{actor}.virtual_pipeline_model_parallel_size=null", f"{actor}.context_parallel_size=1",
                       f"{actor}.expert_model_parallel_size=4", f"{actor}.expert_tensor_parallel_size=1"]
    assert out[6:12] == [o.replace(".actor.", ".ref.") for o in out[:6]]
    assert out[12:] == [f"+{actor}.override_transformer_config.num_layers_in_first_pipeline_stage=2"]


def test_router_replay_data_in_the_memory_model():
    from pathlib import Path

    from mcore_dapo.bridge.hf_config import load_hf_config
    from mcore_dapo.plan.memory import replay_bytes

    cfg = load_hf_config(Path(__file__).resolve().parent.parent / "configs/models/qwen3-30b-a3b")
    assert replay_bytes(cfg, 16384) == 16384 * 48 * 8 * 4  # tokens x MoE layers x top-k x 4 bytes


# ---- verl's trainer modes, projected from a measured step (plan/modes.py) --------------------------------------
GUIDE_LOG = Path(__file__).resolve().parents[2] / "shared" / "seed" / "a2-fsdp-step9.log"
FIX = Path(__file__).resolve().parent / "fixtures" / "metrics"


def test_the_guide_phases_are_the_guides_log():
    from mcore_dapo.plan.modes import GUIDE, phases_from_log

    if not GUIDE_LOG.is_file():
        pytest.skip("the guide's step-9 log (../shared/seed/a2-fsdp-step9.log) is not beside the repository")
    got = phases_from_log(GUIDE_LOG)
    assert {k: v for k, v in got.as_dict().items() if k != "source"} == \
        {k: v for k, v in GUIDE.as_dict().items() if k != "source"}
    text = GUIDE_LOG.read_text()  # the log's own numbers, not the parser's
    for key, value in (("timing_s/gen", GUIDE.gen_s), ("timing_s/generate_sequences", GUIDE.decode_s),
                       ("timing_s/update_actor", GUIDE.update_s), ("timing_s/step", GUIDE.step_s)):
        assert f"{key}:{value!r}" in text


def test_mode_projection_of_the_guides_step(cfg):
    from mcore_dapo.plan.modes import GUIDE, SYNC_S, project

    w = Workload(get_device("h100"), nodes=4)
    best = plan(cfg, w)[0]
    modes = {m.mode: m for m in project(cfg, w, GUIDE, best.time.total_s)}
    assert set(modes) == {"sync", "colocate_async", "separate_async"}
    # sync on the log's own 32 devices is the logged step; colocate decodes for the mean response, not the longest
    assert modes["sync"].step_s == pytest.approx(310.60584014933556)
    assert modes["colocate_async"].step_s == pytest.approx(310.60584014933556 - 142.09425354003906 * (1 - 4725.28125 / 6144))
    assert modes["sync"].tokens_per_s_per_device == pytest.approx(2503440 / (310.60584014933556 * 32))
    sep = modes["separate_async"]
    rollout = sep.detail["rollout_devices"]
    assert rollout == 8 * sep.detail["rollout_nodes"] and sep.detail["trainer_nodes"] + sep.detail["rollout_nodes"] == 4
    assert sep.detail["gen_s"] == pytest.approx(142.09425354003906 * 4725.28125 / 6144 * 32 / rollout, abs=0.01)
    assert sep.step_s == pytest.approx(max(sep.detail["gen_s"], sep.detail["train_s"]) + SYNC_S["h100"], abs=0.02)
    # its training layout fits on the training devices alone (no rollout memory there) and divides the batch
    trainer = Workload(get_device("h100"), nodes=sep.detail["trainer_nodes"], gpu_memory_utilization=0.0)
    pl = next(c for c in plan(cfg, trainer) if c.layout.describe() == sep.detail["trainer_layout"])
    assert pl.fits and (32 * 16) % pl.layout.layout.dp(trainer.world_size) == 0
    for m in modes.values():
        assert m.speedup == pytest.approx(modes["sync"].step_s / m.step_s - 1)
    # cheaper rollouts (plan/modes.py, cheaper): the old-log-prob pass skipped takes the log's 16.4 s off a synchronous
    # step; verl's published FP8 speed-up (1.35) shortens the decoding, on a device with FP8 only
    from mcore_dapo.plan.modes import cheaper

    sync = cheaper(modes["sync"], fp8=True)
    assert sync["bypass_s"] == pytest.approx(310.60584014933556 - 16.38148122187704, abs=0.02)
    assert sync["fp8_s"] == pytest.approx(310.60584014933556 - 142.09425354003906 * (1 - 1 / 1.35), abs=0.02)
    assert "fp8_s" not in cheaper(modes["sync"], fp8=False)
    colo = cheaper(modes["colocate_async"], fp8=True)
    trimmed = 142.09425354003906 * 4725.28125 / 6144  # colocate decodes for the mean response
    assert colo["fp8_s"] == pytest.approx(modes["colocate_async"].step_s - trimmed * (1 - 1 / 1.35), abs=0.02)
    assert get_device("h100").fp8 and get_device("h200").fp8 and not get_device("a2").fp8 \
        and not get_device("a100").fp8


def test_plan_cli_prints_the_modes_keyed_by_verls_names(reference_config, capsys):
    args = ["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8", "--device", "a2",
            "--top", "1"]
    assert cli([*args, "--json", "--phases", str(FIX / "v1_sync.log")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["modes"]) == {"sync", "colocate_async", "separate_async"}
    assert out["modes_phases"]["devices"] == 32 and out["modes_phases"]["weights_s"] == pytest.approx((11.0 + 10.9) / 2)
    assert out["modes"]["colocate_async"]["verl_published_speedup"] == 0.564
    # the rollout layout, as verl's keys, and its projected generation
    roll = out["rollout"]
    assert {"gen_tp", "gen_dp", "gen_ep", "enforce_eager", "generation_s"} <= set(roll)
    assert roll["gen_tp"] in (1, 2, 4, 8) and roll["gen_ep"] in (1, roll["gen_tp"] * roll["gen_dp"])
    assert isinstance(roll["enforce_eager"], bool) and roll["generation_s"] > 0
    assert roll["generation_s"] == roll["candidates"][0]["generation_s"]


def test_an_asynchronous_phase_log_is_refused(reference_config, capsys):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8", "--device",
                "h100", "--phases", str(FIX / "v1_colocate_async.log")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an asynchronous run (trajectory staleness up to 1)" in err
