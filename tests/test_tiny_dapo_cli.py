"""``mcore-dapo tiny-dapo``: bad input is one line, and its settings are the launch scripts' (the trainer itself:
tests/test_verl_trainer.py)."""

import pytest

from mcore_dapo.cli.main import run


@pytest.mark.parametrize("args, line", [
    (["--rollout", "sglang"], "--rollout='sglang' is not accepted: hf_cpu or vllm"),
    (["--steps", "0"], "--steps=0 is not accepted: at least 1"),
    (["--rollout", "hf_cpu", "--router-replay", "R4"], "--router-replay='R4' is not accepted: accepted are off, R2, R3"),
    (["--rollout", "vllm", "--router-replay", "R3"], "--router-replay R3 with --rollout vllm: R3 replays the rollout's "
     "routed experts, which vLLM's CPU build cannot return (its Model Runner V2 needs Triton); accepted on the CPU "
     "is --rollout hf_cpu"),
    (["--rollout-dtype", "fp8"], "--rollout-dtype='fp8' is not accepted: bfloat16 or float32"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert run(["tiny-dapo", "--workdir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {line}"
    assert not any(tmp_path.iterdir())  # refused before anything was prepared


def _args(args: list[str]) -> dict:
    return {a.split("=", 1)[0].lstrip("+"): a.split("=", 1)[1] for a in args}


@pytest.mark.parametrize("replay", [None, "R3"])
def test_the_cpu_trainer_run_is_the_launch_scripts_but_declared_keys(tmp_path, replay):
    """The CPU trainer run composes configs/dapo/common.sh itself; it differs from what the scripts pass only in
    the keys of cpu_changes, each of an accepted kind, and the scripts' production settings stay on."""
    import re

    from mcore_dapo.harness import tiny_dapo as t

    files = {"model": tmp_path / "m", "train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet"}
    cpu = _args(t.overrides(files, tmp_path, 4, router_replay=replay))
    # the scripts' arguments under the same per-device variables (what a device script sets before common.sh)
    script = _args(t.script_args(t.script_env(files, tmp_path), t.layout_overrides(2), replay))
    changes = t.cpu_changes(files, tmp_path, 4, 1e-3, "hf_cpu")
    differ = {k for k in set(cpu) | set(script) if cpu.get(k) != script.get(k)}
    assert differ - set(changes) == set(), sorted(differ - set(changes))
    assert {kind for _, kind in changes.values()} <= {t.SIZES, t.COUNTS, t.ROLLOUT_CPU, t.PACKING}
    # the variables the CPU run sets are the device scripts' own knobs
    knobs = set()
    for script_file in (t.SCRIPT.parent.parent).glob("dapo_qwen3_30b_*.sh"):
        knobs |= set(re.findall(r"^([A-Z_]+)=", script_file.read_text(), re.M))
    assert set(t.script_env(files, tmp_path)) <= knobs
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
