"""``mcore-dapo tiny-dapo``: bad input is one line, and its settings are the launch scripts' (the trainer itself:
tests/test_verl_trainer.py)."""

import pytest

from mcore_dapo.cli.main import run


@pytest.mark.parametrize("args, line", [
    (["--rollout", "sglang"], "--rollout='sglang' is not accepted: hf_cpu or vllm"),
    (["--steps", "0"], "--steps=0 is not accepted: at least 1"),
    (["--steps", "1"], "--steps=1 is not accepted: above the run's LR warm-up of 1 step(s) (actor_rollout_ref.actor."
     "optim.lr_warmup_steps=1: Megatron's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps), or "
     "actor_rollout_ref.actor.optim.lr_warmup_steps=0 as an override"),
    (["--steps", "3", "actor_rollout_ref.actor.optim.lr_warmup_steps=3"], "--steps=3 is not accepted: above the "
     "run's LR warm-up of 3 step(s)"),
    (["--rollout", "hf_cpu", "--router-replay", "R4"], "--router-replay='R4' is not accepted: accepted are off, R2, R3"),
    (["--rollout", "vllm", "--router-replay", "R3"], "--router-replay R3 with --rollout vllm: R3 replays the rollout's "
     "routed experts, which vLLM's CPU build cannot return (its Model Runner V2 needs Triton); accepted on the CPU "
     "is --rollout hf_cpu"),
    (["--rollout-dtype", "fp8"], "--rollout-dtype='fp8' is not accepted: bfloat16 or float32"),
    (["--layout", "pp4"], "--layout='pp4' is not accepted: ep2, h100, h100-dp2, a2"),
    (["--trainer-mode", "fully_async"], "--trainer-mode='fully_async' is not accepted: sync, colocate_async, separate_async"),
    (["--gen-tp", "3"], "--gen-tp=3 is not accepted: 1 or 2 (the tiny model's 4 KV heads over the rollout's ranks, "
     "at most the trainer's 2 or 4 ranks)"),
    (["--gen-tp", "2", "--gen-ep", "4"], "--gen-ep=4 is not accepted: 1 or --gen-tp's 2 (vLLM's expert parallelism "
     "spans a replica's tensor-parallel ranks)"),
    (["--rollout-correction", "token"], "--rollout-correction='token' is not accepted: off, decoupled or bypass"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert run(["tiny-dapo", "--workdir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {line}" or (line.endswith("step(s)") and err.startswith(f"error: {line} ("))
    assert not any(tmp_path.iterdir())  # refused before anything was prepared


@pytest.mark.parametrize("args", [["--steps", "2"], ["--steps", "1", "actor_rollout_ref.actor.optim.lr_warmup_steps=0"],
                                  ["--steps", "1", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.5"]])
def test_steps_past_the_warm_up_are_accepted(tmp_path, args):
    """The warm-up check refuses only a run that would not outlast it (a ratio: main_dapo's check before Ray)."""
    import argparse

    from mcore_dapo_checks.cli.tiny_dapo import _validated, add_commands
    from mcore_dapo_checks.tiny_dapo import WARMUP, cpu_changes

    assert cpu_changes({"model": tmp_path, "train": tmp_path, "val": tmp_path}, tmp_path, 2, 1e-3, "hf_cpu")[
        "actor_rollout_ref.actor.optim.lr_warmup_steps"][0] == WARMUP
    sub = argparse.ArgumentParser().add_subparsers()
    add_commands(sub)
    _validated(sub.choices["tiny-dapo"].parse_args(["--workdir", str(tmp_path), "--rollout", "hf_cpu", *args]))


def test_a_workdir_whose_run_is_finished_is_one_line(tmp_path, capsys):
    """The scripts resume (resume_mode=auto): over a run that reached --steps nothing would train."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("4")
    assert run(["tiny-dapo", "--workdir", str(tmp_path), "--rollout", "hf_cpu", "--steps", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --workdir {tmp_path} holds a checkpoint of step 4: the scripts resume from it "
                   f"(resume_mode=auto) and --steps 4 leaves nothing to train; accepted: --steps above 4, another "
                   f"--workdir, or {tmp_path / 'checkpoints'} removed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # refused before anything was prepared


def _args(args: list[str]) -> dict:
    return {a.split("=", 1)[0].lstrip("+"): a.split("=", 1)[1] for a in args}


@pytest.mark.parametrize("replay, layout, rollout, gen_tp, mode", [
    (None, "ep2", "hf_cpu", 1, "sync"), ("R3", "h100", "hf_cpu", 1, "sync"),
    ("R3", "h100-dp2", "hf_cpu", 1, "separate_async"), (None, "a2", "vllm", 2, "colocate_async")])
def test_the_cpu_trainer_run_is_the_launch_scripts_but_declared_keys(tmp_path, replay, layout, rollout, gen_tp, mode):
    """The CPU trainer run composes configs/dapo/common.sh itself, with a device script's own LAYOUT array for
    the h100 and a2 layout classes; it differs from what the scripts pass only in the keys of cpu_changes, each
    of an accepted kind, and the scripts' production settings stay on."""
    import re

    from mcore_dapo_checks import tiny_dapo as t

    files = {"model": tmp_path / "m", "train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet"}
    cpu = _args(t.overrides(files, tmp_path, 4, router_replay=replay, layout=layout, rollout=rollout, gen_tp=gen_tp,
                            trainer_mode=mode))
    # the scripts' arguments under the same per-device variables (what a device script sets before common.sh),
    # with the device script's LAYOUT as it stands (EP2 alone for ep2)
    full_layout = t.layout_overrides(2) if layout == "ep2" else t.script_layout(t.LAYOUT_CLASSES[layout].get("script", layout))
    script = _args(t.script_args(t.script_env(files, tmp_path, gen_tp, mode), full_layout, replay))
    changes = t.cpu_changes(files, tmp_path, 4, 1e-3, rollout, layout, mode)
    differ = {k for k in set(cpu) | set(script) if cpu.get(k) != script.get(k)}
    assert differ - set(changes) == set(), sorted(differ - set(changes))
    assert {kind for _, kind in changes.values()} <= {t.SIZES, t.COUNTS, t.ROLLOUT_CPU, t.PACKING}
    # the variables the CPU run sets are the device scripts' own knobs
    knobs = set(re.findall(r"\$\{([A-Z_]+)(?::-[^}]*)?\}", t.SCRIPT.read_text()))  # those common.sh reads
    for script_file in (t.SCRIPT.parent.parent).glob("dapo_qwen3_30b_*.sh"):
        knobs |= set(re.findall(r"^([A-Z_]+)=", script_file.read_text(), re.M))
    assert set(t.script_env(files, tmp_path, gen_tp, mode)) <= knobs, set(t.script_env(files, tmp_path, gen_tp, mode)) - knobs
    # the trainer mode is the scripts' ASYNC
    assert cpu.get("trainer.v1.trainer_mode", "sync") == mode
    # the production settings of the scripts, on in the CPU run
    a = "actor_rollout_ref.actor"
    assert cpu[f"{a}.use_dynamic_bsz"] == "True" and cpu[f"{a}.megatron.param_offload"] == "True"
    assert cpu[f"{a}.megatron.optimizer_offload"] == "True" and cpu["actor_rollout_ref.ref.megatron.param_offload"] == "True"
    assert cpu["actor_rollout_ref.model.enable_gradient_checkpointing"] == "True"
    assert f"{a}.megatron.use_distributed_optimizer" not in cpu  # verl's default: on
    assert int(cpu[f"{a}.optim.lr_warmup_steps"]) > 0 and cpu[f"{a}.optim.use_checkpoint_opt_param_scheduler"] == "True"
    assert cpu["trainer.resume_mode"] == "auto" and 0 < int(cpu["trainer.save_freq"]) <= 4
    assert 0 < int(cpu["trainer.test_freq"]) <= 4 and cpu["algorithm.filter_groups.enable"] == "True"
    assert cpu["reward.reward_manager.name"] == "dapo" and not any("custom_reward_function" in k for k in cpu)
    # one micro-batch holds two of the longest sequences: a rank's share of the batch splits into several
    assert int(cpu[f"{a}.ppo_max_token_len_per_gpu"]) < t.TRAIN_BSZ * t.N // 2 * (t.MAX_PROMPT + t.MAX_RESPONSE)


def test_layout_classes_are_the_device_scripts_layouts():
    """The h100 and a2 runs take the scripts' layout class: TP2 with sequence parallelism under EP (ETP1); PP2
    with VPP2 and a heavier first stage under EP; full recompute in both. Only EP and the stage sizes change."""
    from mcore_dapo_checks import tiny_dapo as t

    a = "actor_rollout_ref.actor.megatron"
    h100 = _args(t.script_layout("h100"))
    assert (h100[f"{a}.tensor_model_parallel_size"], h100[f"{a}.sequence_parallel"]) == ("2", "True")
    assert int(h100[f"{a}.expert_model_parallel_size"]) > 1 and h100[f"{a}.expert_tensor_parallel_size"] == "1"
    a2 = _args(t.script_layout("a2"))
    assert (a2[f"{a}.pipeline_model_parallel_size"], a2[f"{a}.virtual_pipeline_model_parallel_size"]) == ("2", "2")
    first = int(a2[f"{a}.override_transformer_config.num_layers_in_first_pipeline_stage"])
    last = int(a2[f"{a}.override_transformer_config.num_layers_in_last_pipeline_stage"])
    assert first > last and int(a2[f"{a}.expert_model_parallel_size"]) > 1
    for layout in (h100, a2):
        assert layout[f"{a}.override_transformer_config.recompute_granularity"] == "full"
    # at tiny size: the same class (the first stage heavier, each stage's layers split over the two virtual stages)
    tiny = t.LAYOUT_CLASSES["a2"]["changes"]
    f, l = (tiny[f"override_transformer_config.num_layers_in_{s}_pipeline_stage"] for s in ("first", "last"))
    assert f > l and f % 2 == 0 and l % 2 == 0 and f + l == t.LAYOUT_CLASSES["a2"]["layers"]


def test_one_entry_point(tmp_path, capsys):
    """``python -m mcore_dapo_checks.tiny_dapo`` is ``mcore-dapo tiny-dapo``: the same parser, defaults and errors."""
    from mcore_dapo_checks.tiny_dapo import main

    assert main(["--workdir", str(tmp_path), "--lr", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --lr=0.0 is not accepted: a positive learning rate"
    assert main(["--workdir", str(tmp_path), "--teach-p", "1.5"]) == 2
    assert capsys.readouterr().err.strip() == "error: --teach-p=1.5 is not accepted: a share between 0 and 1"
    assert main(["--workdir", str(tmp_path), "use_kl_loss"]) == 2
    assert capsys.readouterr().err.strip() == "error: override='use_kl_loss' is not accepted: key=value, +key=value or ~key (Hydra)"
    assert not any(tmp_path.iterdir())


def test_an_audited_run_fails_when_an_update_misses_the_audit(tmp_path):
    # the run's summary judges every audited update as the suite does (mcore_dapo_checks.audit_verdict): an update
    # whose experts' gradient norm is twice the reference's at a part bound far below that fails the run
    import json

    from mcore_dapo_checks.cli.tiny_dapo import report

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.5, "actor/grad_norm": 0.5}}) + "\n")
    update = {"step": "step-0000", "optimizer_source": "launch", "optimizer_failures": [], "engine_loss": 0.01,
              "loss_at_engine_log_probs": 0.01, "reference_loss": 0.0101, "forced_routes": [[5, 4, 2]],
              "routes_native_agreement": 1.0, "routes_tie_ratio_max": 0.0, "engine_grad_norm": 0.5,
              "reference_grad_norm": 0.5, "engine_part_grad_norms": {"experts": 0.3, "output layer": 0.4},
              "reference_part_grad_norms": {"experts": 0.3, "output layer": 0.4},
              "reference_bf16_part_grad_diff": {"experts": 0.001, "output layer": 0.001},
              "logprob_max_scaled_diff": 0.01, "lr": 0.0, "weights_beyond_one_step": 0.0, "weights_max_abs_diff": 0.0,
              "weights_moved": 0.0}
    run = {"returncode": 0, "seconds": 1.0, "steps": 1, "metrics_log": str(metrics), "train_log": str(tmp_path / "t"),
           "audit": [update]}
    summary, ok = report(run, 1, None)
    assert ok and summary["steps"][0]["audit_misses"] == []
    doubled = {**update, "engine_part_grad_norms": {"experts": 0.6, "output layer": 0.4},
               "engine_grad_norm": (0.6 ** 2 + 0.4 ** 2) ** 0.5}
    summary, ok = report({**run, "audit": [doubled]}, 1, None)
    assert not ok and summary["steps"][0]["audit_misses"] == ["gradient: experts"]
