"""The verl plugin: override rewriting, DRY_RUN of the DAPO scripts (valid and invalid layouts), engine registration."""

import importlib.metadata
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("verl")

from mcore_dapo.errors import UserError  # noqa: E402
from mcore_dapo.megatron_compat import supports_routing_replay  # noqa: E402
from mcore_dapo.verl_plugin.overrides import rewrite, rewrite_main_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MCORE = importlib.metadata.version("megatron-core")


def test_strategy_megatron_implies_model_engine():
    assert rewrite(["a=1", "actor_rollout_ref.actor.strategy=megatron"])[0] == "model_engine=megatron"
    assert rewrite(["actor_rollout_ref.actor.strategy=fsdp"]) == ["actor_rollout_ref.actor.strategy=fsdp"]
    same = ["model_engine=megatron", "actor_rollout_ref.actor.strategy=megatron"]
    assert rewrite(same) == same
    with pytest.raises(UserError, match="contradicts model_engine=dp"):
        rewrite(["model_engine=dp", "actor_rollout_ref.actor.strategy=megatron"])


def test_main_ppo_argv_is_rewritten_only_for_verl_main():
    argv = ["main_ppo.py", "actor_rollout_ref.actor.strategy=megatron"]
    assert rewrite_main_argv(argv, ["python", "-m", "verl.trainer.main_ppo", *argv[1:]])
    assert argv[1] == "model_engine=megatron"
    other = ["x.py", "actor_rollout_ref.actor.strategy=megatron"]
    assert not rewrite_main_argv(other, ["python", "x.py", *other[1:]])


def dry_run(script: str, *overrides: str, **env_vars: str) -> subprocess.CompletedProcess:
    """The launch script itself with DRY_RUN=1, in a new process: bash, then python3 as the script calls it."""
    env = {**os.environ, "DRY_RUN": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env_vars}
    return subprocess.run(["bash", str(ROOT / "configs" / script), *overrides], capture_output=True, text=True,
                          env=env, timeout=300)


# Variables of bash's own, not the script's: never copied into this process.
BASH_OWN = {"_", "SHLVL", "PWD", "OLDPWD"}


def script_call(script: str, *overrides: str, **env_vars: str) -> tuple[list[str], dict]:
    """What ``configs/<script>`` runs, as bash composes it: the arguments it passes to ``python3 -m
    mcore_dapo.verl_plugin.main_dapo`` and the environment it exports. python3 is a bash function here that
    writes them down, so nothing is started."""
    import shlex
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        args, env_out = Path(d) / "args", Path(d) / "env"
        shim = (f'python3() {{ printf "%s\\0" "$@" > {shlex.quote(str(args))}; env -0 > {shlex.quote(str(env_out))}; '
                '}; export -f python3; exec bash "$@"')
        p = subprocess.run(["bash", "-c", shim, "bash", str(ROOT / "configs" / script), *overrides],
                           capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", **env_vars},
                           timeout=60)
        assert p.returncode == 0 and args.is_file(), p.stderr[-2000:]
        argv = [x for x in args.read_text().split("\0") if x]
        env = dict(x.split("=", 1) for x in env_out.read_text().split("\0") if "=" in x)
    assert argv[:2] == ["-m", "mcore_dapo.verl_plugin.main_dapo"], argv[:2]
    return argv[2:], {k: v for k, v in env.items() if k not in BASH_OWN and not k.startswith("BASH_FUNC_")}


def dry_run_here(monkeypatch, capsys, script: str, *overrides: str, **env_vars: str) -> subprocess.CompletedProcess:
    """:func:`dry_run` with main_dapo called in this process (verl is imported once for the whole file): the
    script's arguments and exported variables as bash composes them (:func:`script_call`)."""
    from mcore_dapo.verl_plugin import main_dapo

    argv, env = script_call(script, *overrides, **env_vars)
    for k, v in env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    capsys.readouterr()
    rc = main_dapo.main(argv)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out, err)


@pytest.mark.parametrize("script, want, logger", [
    ("dapo_qwen3_30b_h100.sh", {"tp": 2, "pp": 1, "ep": 8, "etp": 1, "dp": 16, "edp": 4, "world_size": 32},
     ["tensorboard", "console"]),
    ("dapo_qwen3_30b_a2.sh", {"tp": 1, "pp": 2, "ep": 8, "vpp": 2, "dp": 16, "edp": 2, "world_size": 32},
     ["console"]),
])
def test_dry_run_valid(script, want, logger, tmp_path):
    from omegaconf import OmegaConf

    out = tmp_path / "composed.yaml"
    p = dry_run(script, MCORE_DAPO_CONFIG_OUT=str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in want} == want
    from mcore_dapo.devices.cuda import te_available

    # the H100 script packs sequences: a launch from a machine without Transformer Engine would be refused
    assert ("refused_here" in got) == (got["device"] == "cuda" and not te_available())
    # the settings the scripts add to verl's defaults, as verl's composed config holds them
    c = OmegaConf.load(out)
    assert list(c.trainer.logger) == logger  # the guide's per device; verl's default adds wandb
    assert c.actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler is True  # resume keeps the LR schedule
    fg = c.algorithm.filter_groups  # verl 0.9.1: up to max_inflight_gen_batches * train_batch_size prompts in flight
    assert (fg.enable, fg.metric, fg.max_inflight_gen_batches) == (True, "acc", 3)
    assert fg.max_inflight_gen_batches * c.data.train_batch_size == 96  # the guide's gen_batch_size


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8"], "does not divide the 4 KV groups"),
    (["trainer.nnodes=3", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=3",
      "actor_rollout_ref.ref.megatron.expert_model_parallel_size=3"], "does not divide the 128 experts"),
    (["actor_rollout_ref.ref.megatron.expert_model_parallel_size=4"], "and ref layout"),
    (["trainer.nnodes=1", "trainer.n_gpus_per_node=4"], "world size 4 is not divisible by ETP*EP*PP = 8"),
    (["trainer.nnodes=3"], "ppo_mini_batch_size*rollout.n = 512 is not divisible by the data-parallel size 12"),
    (["trainer.device=cpu"], "set actor_rollout_ref.model.use_remove_padding=False on the CPU"),
    # verl's keys outside override_transformer_config: honoured or refused, never ignored (model_settings)
    (["+actor_rollout_ref.model.override_config.rope_theta=1000"],
     "actor_rollout_ref.model.override_config.rope_theta is not honoured on the Megatron path: accepted are "
     "attention_dropout, resid_pdrop, embd_pdrop"),
    (["+actor_rollout_ref.model.override_config.resid_pdrop=0.1", "+actor_rollout_ref.model.override_config.embd_pdrop=0."],
     "resid_pdrop and embd_pdrop differ"),
    (["actor_rollout_ref.actor.megatron.sequence_parallel=False"],
     "actor_rollout_ref.actor.megatron.sequence_parallel=False with tensor_model_parallel_size=2"),
    (["+actor_rollout_ref.actor.megatron.override_mcore_model_config.share_embeddings=True"],
     "override_mcore_model_config.share_embeddings is not honoured: accepted is moe_config.freeze_moe_router"),
    (["actor_rollout_ref.actor.megatron.use_distributed_optimizer=False"],
     "param_offload=True with use_distributed_optimizer=False: verl's offload needs the distributed optimizer"),
])
def test_dry_run_invalid(overrides, message, monkeypatch, capsys):
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", *overrides)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("error: ")


OPTIM = "actor_rollout_ref.actor.optim"


@pytest.mark.parametrize("overrides, line", [
    (["trainer.total_training_steps=5"],  # the scripts' warm-up is 10 steps
     f"{OPTIM}.lr_warmup_steps=10 with trainer.total_training_steps=5: the warm-up does not end within the run's 5 "
     "scheduler steps (Megatron's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps, inside a Ray "
     f"worker); accepted is {OPTIM}.lr_warmup_steps below 5 (or <= 0 with lr_warmup_steps_ratio below 1), or "
     "trainer.total_training_steps above 10"),
    (["trainer.total_training_steps=10"], "the warm-up does not end within the run's 10 scheduler steps"),
    ([f"{OPTIM}.lr_warmup_steps=-1", f"{OPTIM}.lr_warmup_steps_ratio=1.0"],
     f"{OPTIM}.lr_warmup_steps_ratio=1.0 (with lr_warmup_steps=-1) makes the warm-up as long as the run"),
    ([f"+{OPTIM}.lr_decay_steps=8"], f"{OPTIM}.lr_warmup_steps=10 with {OPTIM}.lr_decay_steps=8: the warm-up"),
    (["trainer.total_training_steps=0"], "trainer.total_training_steps=0 leaves the LR schedule no step"),
])
def test_a_warm_up_the_run_does_not_outlast_is_one_line_before_ray(overrides, line, monkeypatch, capsys):
    """Megatron's scheduler asserts warm-up < decay steps in every Ray worker: the dry run refuses it where the
    run's length is known before Ray (trainer.total_training_steps, optim.lr_decay_steps, a ratio of 1 or more)."""
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", *overrides)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert p.stderr.startswith("error: ") and line in p.stderr, p.stderr


@pytest.mark.parametrize("overrides", [["trainer.total_training_steps=11"], [],  # the scripts': epochs, no total
                                       [f"{OPTIM}.lr_warmup_steps=0", "trainer.total_training_steps=1"]])
def test_a_warm_up_that_ends_within_the_run_passes(overrides, monkeypatch, capsys):
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", *overrides)
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.parametrize("trainer, optim, horizon", [
    ({"total_training_steps": 3, "v1": {"separate_async": {"parameter_sync_step": 4}}}, {"lr_warmup_steps": 10}, 12),
    ({"total_training_steps": 3, "use_v1": False, "v1": {"separate_async": {"parameter_sync_step": 4}}},
     {"lr_warmup_steps": 10}, None),  # verl's legacy trainer: one scheduler step a training step
    ({"total_training_steps": 4}, {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.5}, 4),
    ({"total_training_steps": None}, {"lr_warmup_steps": 10**6}, "unknown"),  # epochs x data: known inside Ray
    ({"total_training_steps": 2}, {"lr_warmup_steps": 10, "lr_decay_steps": 20}, 20),  # verl's horizon
])
def test_the_schedule_horizon_is_verls(trainer, optim, horizon):
    """verl's v1 trainer counts parameter_sync_step scheduler steps a training step (verl/trainer/ppo/v1/
    trainer_base.py); lr_decay_steps, when set, is the horizon (verl/utils/megatron/optimizer.py)."""
    from omegaconf import OmegaConf

    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.config_checks import check_lr_schedule

    c = OmegaConf.create({"trainer": trainer, "actor_rollout_ref": {"actor": {"optim": {
        "lr_warmup_steps_ratio": 0.0, "lr_decay_steps": None, **optim}}}})
    if horizon is None:
        with pytest.raises(UserError, match="trainer.total_training_steps=3: the warm-up"):
            check_lr_schedule(c, "separate_async")
    else:
        assert check_lr_schedule(c, "separate_async") == (None if horizon == "unknown" else horizon)


def test_dry_run_takes_the_guides_dropouts_and_verls_router_freeze(monkeypatch, capsys, tmp_path):
    # the guide's FSDP script sets three HF dropouts (to 0); on the Megatron path they become TransformerConfig's.
    # The bridge's own dropouts are 0 too, so values other than 0 show that the keys reach it: the engine's
    # TransformerConfig built (mcore_dapo.verl_plugin.engine._build_tf_config, what the engine runs at init) from
    # the dry run's composed config, with verl's own config classes, as verl's worker builds them
    from omegaconf import OmegaConf

    from verl.utils.config import omega_conf_to_dataclass

    from mcore_dapo.verl_plugin.engine import _build_tf_config

    composed = tmp_path / "composed.yaml"
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh",
                     "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
                     "+actor_rollout_ref.model.override_config.embd_pdrop=0.2",
                     "+actor_rollout_ref.model.override_config.resid_pdrop=0.2",
                     "+actor_rollout_ref.actor.megatron.override_mcore_model_config.moe_config.freeze_moe_router=True",
                     "actor_rollout_ref.model.use_remove_padding=False",  # no packed attention on this machine
                     MCORE_DAPO_CONFIG_OUT=str(composed))
    assert p.returncode == 0, p.stderr[-2000:]
    c = OmegaConf.load(composed)
    c.actor_rollout_ref.model.path = str(ROOT / "configs" / "models" / "qwen3-30b-a3b")  # its config.json only
    c.actor_rollout_ref.model.load_tokenizer = False
    engine_config = omega_conf_to_dataclass(c.actor_rollout_ref.actor.megatron)
    model_config = omega_conf_to_dataclass(c.actor_rollout_ref.model)
    engine_config.use_remove_padding = model_config.get("use_remove_padding", False)  # verl/workers/engine_workers.py
    engine = types.SimpleNamespace(engine_config=engine_config, model_config=model_config)
    _build_tf_config(engine)
    assert (engine.tf_config.attention_dropout, engine.tf_config.hidden_dropout) == (0.1, 0.2)
    assert engine.mcore_freeze_router is True  # the routers' weights are frozen from it (_build_megatron_module)


def test_model_settings_become_transformer_config_fields():
    from mcore_dapo.verl_plugin import model_settings as ms

    assert ms.dropout_fields({"attention_dropout": 0.1, "resid_pdrop": 0.2, "embd_pdrop": 0.2}) == \
        {"attention_dropout": 0.1, "hidden_dropout": 0.2}
    assert ms.recompute(True, {}) == "full" and ms.recompute(False, {}) == "none"
    assert ms.recompute(True, {"recompute_granularity": "selective"}) == "none"  # the user's fields decide
    # verl's defaults: null granularity and method, recompute_modules ["core_attn"] (inert without a granularity)
    assert ms.recompute(True, {"recompute_granularity": None, "recompute_method": None,
                               "recompute_modules": ["core_attn"]}) == "full"
    assert ms.sequence_parallel(True, 1, True, "m") is False and ms.sequence_parallel(True, 2, True, "m") is True
    assert ms.freeze_moe_router({"moe_config": {"freeze_moe_router": True}}, "m") is True
    assert ms.freeze_moe_router(None, "m") is False


def test_dry_run_router_replay_env(monkeypatch, capsys):
    # ROUTER_REPLAY=R3: verl's replay mode and the rollout returning its routed experts
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", ROUTER_REPLAY="R3")
    if not supports_routing_replay():
        # megatron-core before 0.16.0 has no routing replay: refused in one line, never trained without it
        assert p.returncode == 2
        assert p.stderr.strip().splitlines() == [
            f"error: router_replay.mode=R3 needs MoE routing replay, which megatron-core {MCORE} does not have "
            "(TransformerConfig.moe_enable_routing_replay, from megatron-core 0.16.0); accepted with megatron-core "
            f"{MCORE} is router_replay.mode=disabled"]
        return
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["router_replay"] == "R3"
    # R3 with a rollout that does not return routes would have nothing to replay: refused
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh",
                     "actor_rollout_ref.rollout.enable_rollout_routing_replay=False", ROUTER_REPLAY="R3")
    assert p.returncode == 2 and "enable_rollout_routing_replay=True" in p.stderr.strip().splitlines()[-1]
    p = dry_run("dapo_qwen3_30b_h100.sh", ROUTER_REPLAY="R4")  # refused by bash: python never starts
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: ROUTER_REPLAY=R4 is not accepted: accepted are off, R2, R3"]


SEP = "trainer.v1.trainer_mode=separate_async"


@pytest.mark.parametrize("env, want", [
    ({"ASYNC": "off"}, {"trainer_mode": "sync", "world_size": 32}),
    ({}, {"trainer_mode": "colocate_async", "world_size": 32}),  # the script's default, from the planner
    ({"ASYNC": "separate"}, {"trainer_mode": "separate_async", "world_size": 16, "dp": 8}),
])
def test_dry_run_trainer_modes(env, want, monkeypatch, capsys, tmp_path):
    """ASYNC=off|colocate|separate compose with verl's config and pass its checks; the composed keys are
    verl's own (docs/VERL_PLUGIN.md, "Asynchronous modes")."""
    from omegaconf import OmegaConf

    out = tmp_path / "c.yaml"
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", MCORE_DAPO_CONFIG_OUT=str(out), **env)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in want} == want
    c = OmegaConf.load(out)
    v1, rc, rollout = c.trainer.v1, c.algorithm.rollout_correction, c.actor_rollout_ref.rollout
    if want["trainer_mode"] == "sync":
        assert (rc.rollout_is, rc.rollout_rs, v1.sampler.max_off_policy_threshold) == (None, None, 8)  # verl's
        return
    assert (v1.sampler.max_off_policy_threshold, v1.sampler.max_off_policy_strategy) == (4, "drop")
    assert (rc.bypass_mode, rc.rollout_is, rc.rollout_is_threshold, rc.rollout_rs, rc.rollout_rs_threshold) == \
        (False, "token", 2.0, "seq_mean_k3", 0.01)
    if want["trainer_mode"] == "colocate_async":
        assert v1.colocate_async.num_warmup_batches == 1 and c.actor_rollout_ref.hybrid_engine is True
        return
    assert c.actor_rollout_ref.hybrid_engine is False and (c.trainer.nnodes, rollout.nnodes) == (2, 2)
    assert rollout.n_gpus_per_node == 8 and rollout.checkpoint_engine.backend == "nccl"
    assert v1.separate_async.parameter_sync_step * c.actor_rollout_ref.actor.ppo_mini_batch_size == \
        c.data.train_batch_size
    assert not v1.separate_async.hybrid_rollout.enable_switch


def test_the_scripts_checkpoint_engine_is_the_device_adapters():
    from mcore_dapo.devices import get_adapter

    for script, device in (("dapo_qwen3_30b_h100.sh", "cuda"), ("dapo_qwen3_30b_a2.sh", "npu")):
        argv, _ = script_call(script, ASYNC="separate")
        backend = [a.split("=", 1)[1] for a in argv if a.startswith("actor_rollout_ref.rollout.checkpoint_engine.backend=")]
        assert backend == [get_adapter(device).rollout.checkpoint_engine()[0]] == ["nccl"]
    assert get_adapter("cpu").rollout.checkpoint_engine() == ("gloo", "mcore_dapo.verl_cpu.checkpoint_engine")


CPU = ("trainer.device=cpu", "actor_rollout_ref.model.use_remove_padding=False")


@pytest.mark.parametrize("env, overrides, line", [
    ({}, ["trainer.v1.trainer_mode=fully_async"],
     "trainer.v1.trainer_mode=fully_async is not accepted: accepted are sync, colocate_async, separate_async"),
    ({}, ["actor_rollout_ref.hybrid_engine=False"],
     "actor_rollout_ref.hybrid_engine=False with trainer.v1.trainer_mode=colocate_async: its rollout shares the "
     "training devices (verl ignores the setting); accepted is hybrid_engine=True, or trainer_mode=separate_async "
     "for a rollout pool of its own"),
    ({"ASYNC": "separate"}, ["actor_rollout_ref.rollout.nnodes=0"],
     "actor_rollout_ref.rollout.nnodes=0 with trainer_mode=separate_async: the rollout needs devices of its own; "
     "accepted is a positive number"),
    ({"ASYNC": "separate"}, ["actor_rollout_ref.rollout.n_gpus_per_node=0"],
     "actor_rollout_ref.rollout.n_gpus_per_node=0 with trainer_mode=separate_async: the rollout needs devices of "
     "its own; accepted is a positive number"),
    ({"ASYNC": "separate"}, ["trainer.v1.separate_async.parameter_sync_step=4"],
     "trainer.v1.separate_async.parameter_sync_step=4 with data.train_batch_size=32 and ppo_mini_batch_size=32: "
     "separate_async trains one mini-batch per round, so accepted is train_batch_size = parameter_sync_step x "
     "ppo_mini_batch_size (parameter_sync_step=1)"),
    ({"ASYNC": "separate"}, ["actor_rollout_ref.hybrid_engine=True"],
     "actor_rollout_ref.hybrid_engine=True with trainer_mode=separate_async: verl would also put rollout replicas "
     "on the training devices (memory held, a second weight sync); accepted is hybrid_engine=False"),
    ({"ASYNC": "separate"}, ["trainer.v1.separate_async.hybrid_rollout.enable_switch=True"],
     "trainer.v1.separate_async.hybrid_rollout.enable_switch=True lends the training devices to generation "
     "through replicas that hybrid_engine=False does not build (verl ignores it); accepted is enable_switch=False"),
    ({"ASYNC": "separate"}, ["actor_rollout_ref.rollout.checkpoint_engine.backend=naive"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend=naive with trainer_mode=separate_async: naive hands "
     "weights to a rollout on the same devices; accepted is 'nccl'"),
    ({"ASYNC": "separate"}, ["actor_rollout_ref.rollout.checkpoint_engine.backend=gloo"],
     "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo is not accepted on trainer.device=cuda: accepted "
     "is nccl (the device's transport)"),
    ({"ASYNC": "separate"}, [*CPU],
     "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl is not accepted on trainer.device=cpu: accepted "
     "is gloo (the device's transport)"),
    ({"ASYNC": "separate"}, [*CPU, "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo"],
     "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=None with backend gloo on cpu: accepted "
     "is mcore_dapo.verl_cpu.checkpoint_engine (it registers the backend)"),
])
def test_trainer_mode_bad_settings_are_one_line_before_ray(env, overrides, line, monkeypatch, capsys):
    p = dry_run_here(monkeypatch, capsys, "dapo_qwen3_30b_h100.sh", *overrides, **env)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {line}"]


def test_bad_async_variables_are_refused_by_bash():
    for env, line in (({"ASYNC": "on"}, "error: ASYNC=on is not accepted: accepted are off, colocate, separate"),
                      ({"ASYNC": "separate", "ROLLOUT_NNODES": "4"},
                       "error: ROLLOUT_NNODES=4 is not accepted with ASYNC=separate: accepted is 1 to 3 of the "
                       "NNODES=4 nodes")):
        p = subprocess.run(["bash", str(ROOT / "configs" / "dapo_qwen3_30b_h100.sh")], capture_output=True,
                           text=True, env={**os.environ, "DRY_RUN": "1", **env}, timeout=60)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [line]


ENGINE_CLASSES = (
    "import sys, verl; assert 'megatron' not in sys.modules; import verl.workers.engine as e; "
    "from mcore_dapo.verl_plugin.engine import McoreDapoCpuEngine, McoreDapoEngine; "
    "r = e.EngineRegistry._engines['language_model']['megatron']; cpu, dev = r['cpu'], r[('cuda', 'nvidia')]; "
    "assert r[('npu', 'huawei')] is dev; "
    "print(cpu.__name__, dev.__name__, issubclass(cpu, McoreDapoCpuEngine), issubclass(dev, McoreDapoEngine), "
    "sorted(k for k in ('to', 'train_mode', 'eval_mode', 'save_checkpoint') "
    "for c in dev.__mro__ if c.__module__.startswith('mcore_dapo') and k in vars(c)), "
    "'mcore_dapo_checks.audit' in sys.modules)")

# the modules of the plugin that hold a subclass of a verl class (and so import verl); the reference is this list,
# not the registration table it is checked against
VERL_CLASS_MODULES = {"mcore_dapo.verl_plugin.engine", "mcore_dapo.verl_plugin.checkpoint_manager",
                      "mcore_dapo.verl_cpu.platform", "mcore_dapo.verl_cpu.replica", "mcore_dapo.verl_cpu.checkpoint_engine"}
PLUGIN_IMPORTS = (
    "import sys, pkgutil, importlib, inspect, mcore_dapo.verl_plugin as p, mcore_dapo.verl_cpu as c; "
    "mods = sorted(pkg.__name__ + '.' + m.name for pkg in (p, c) for m in pkgutil.iter_modules(pkg.__path__)); "
    "classes = set(sys.argv[1].split(',')); "
    "[importlib.import_module(m) for m in mods if m not in classes and not m.endswith('.enable')]; "
    "print('verl' in sys.modules, 'megatron' in sys.modules, 'mcore_dapo.migrate' in sys.modules); "
    "[importlib.import_module(m) for m in sorted(classes)]; "
    "from verl.workers.engine.base import EngineRegistry; from verl.plugin.platform.platform_manager import "
    "PlatformRegistry; from verl.workers.rollout import base, replica; "
    "ours = lambda x: getattr(x, '__module__', '').startswith('mcore_dapo'); "
    "engines = [k for d in EngineRegistry._engines.values() for b in d.values() for k, v in b.items() if ours(v)]; "
    "import json; print(json.dumps([sorted(str(k) for k in engines), getattr(PlatformRegistry.get('cpu'), "
    "'__name__', None), [k for k in replica.RolloutReplicaRegistry._registry if k == 'hf_cpu'], "
    "[k for k, v in base._ROLLOUT_REGISTRY.items() if v.startswith('mcore_dapo')]])); "
    "from mcore_dapo.verl_plugin import registrations as r; "
    "verl_subclasses = sorted(f'{m}.{n}' for m in mods if m in classes for n, k in "
    "vars(sys.modules[m]).items() if inspect.isclass(k) and k.__module__ == m and "
    "any(b.__module__.startswith('verl.') for b in k.__mro__[1:])); "
    "print(verl_subclasses == sorted({row.cls for row in r.TABLE} | {"
    "'mcore_dapo.verl_plugin.checkpoint_manager.McoreDapoCheckpointManager', "
    "'mcore_dapo.verl_cpu.checkpoint_engine.GlooCheckpointEngine'}), verl_subclasses)")


@pytest.mark.main_stack_only  # verl's registries and this project's modules: the same on both lines
def test_a_module_registers_its_own_classes_only():
    """verl's plugin discovery off (``import verl`` does not run the entry point): the plugin's modules that hold no
    subclass of a verl class import neither verl, nor Megatron, nor ``migrate``, and register nothing; the class
    modules register their platform and engines as their class statements run, under the keys below (verl's own
    pattern), and nothing by path (the rollout's rows are the entry point's); every module-level subclass of a verl
    class is one of the registration table's (or the checkpoint manager the engine builds, or the gloo transport,
    which registers itself by verl's contract for ``custom_backend_module``); the installed entry point is
    ``enable``."""
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"}
    p = subprocess.run([sys.executable, "-c", PLUGIN_IMPORTS, ",".join(sorted(VERL_CLASS_MODULES))],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "False False False"  # nor `migrate` (the entry path reads keys from mcore_dapo.launch_keys)
    # the gloo transport's own registration is not one of these registries
    assert json.loads(lines[1]) == [["('cuda', 'nvidia')", "('npu', 'huawei')", "cpu"], "PlatformCPU", [], []]
    assert lines[2].startswith("True "), lines[2]
    code = ("import importlib.metadata as md; "
            "print([e.value for e in md.entry_points(group='verl.plugins') if e.name == 'mcore_dapo'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["['mcore_dapo.verl_plugin.enable']"]


def test_no_class_of_the_product_is_built_inside_a_function():
    """verl's pattern: module-level classes. No class statement inside a function of the product, no instance
    made another class by assigning ``__class__``, and no read of a registry's private table (verl 0.9.1 offers
    no function that registers a rollout adapter: its ``_ROLLOUT_REGISTRY`` dict is written, never read)."""
    assert _class_problems(ROOT / "mcore_dapo") == []


def test_the_class_check_sees_a_nested_class_a_class_swap_and_a_private_read(tmp_path):
    (tmp_path / "m.py").write_text("def f(base):\n    class C(base):\n        pass\n    return C\n"
                                   "def g(m):\n    m.__class__ = int\n"
                                   "def h(r):\n    return 'x' in r._registry\n"
                                   "def ok(base):\n    base._ROLLOUT_REGISTRY['k'] = 'v'\n")
    assert _class_problems(tmp_path) == ["m.py:2 class C inside a function", "m.py:6 assigns __class__",
                                         "m.py:8 reads _registry"]


PRIVATE_TABLES = {"_engines", "_registry", "_platforms", "_ROLLOUT_REGISTRY"}


def _class_problems(root) -> list[str]:
    import ast

    out = []
    for f in sorted(root.rglob("*.py")):
        tree, rel = ast.parse(f.read_text()), f.relative_to(root)
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            out += [f"{rel}:{n.lineno} class {n.name} inside a function" for n in ast.walk(fn)
                    if isinstance(n, ast.ClassDef)]
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr == "__class__" and isinstance(n.ctx, ast.Store):
                out.append(f"{rel}:{n.lineno} assigns __class__")
            if isinstance(n, ast.Attribute) and n.attr in PRIVATE_TABLES and isinstance(n.ctx, ast.Load):
                parent_store = any(isinstance(s, ast.Subscript) and s.value is n and isinstance(s.ctx, ast.Store)
                                   for s in ast.walk(tree))
                if not parent_store:
                    out.append(f"{rel}:{n.lineno} reads {n.attr}")
    return sorted(set(out), key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


def test_engine_registered_per_device_after_verl_engine_import(monkeypatch):
    """The device class keeps what every device shares; verl's ``cpu`` device gets the subclass that tells load
    from offload; the audit harness is neither imported nor installed without the engine hook naming it."""
    monkeypatch.delenv("MCORE_DAPO_ENGINE_HOOK", raising=False)
    monkeypatch.setenv("MCORE_DAPO_AUDIT_DIR", "/nonexistent")  # the directory alone installs nothing
    p = subprocess.run([sys.executable, "-c", ENGINE_CLASSES], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["McoreDapoCpuEngine", "McoreDapoEngine", "True", "True", "[]", "False"]


@pytest.mark.main_stack_only  # verl's registries and this project's modules: the same on both lines
def test_audit_is_a_wrapper_installed_only_through_the_engine_hook(monkeypatch, tmp_path):
    from mcore_dapo_checks.audit import audit_env

    for k, v in audit_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    p = subprocess.run([sys.executable, "-c", ENGINE_CLASSES], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["AuditedMcoreDapoCpuEngine", "AuditedMcoreDapoEngine", "True", "True", "[]", "True"]


@pytest.mark.cpu_only
def test_cpu_platform_and_rollout_registered_on_a_cpu_torch():
    code = ("import sys, verl; assert 'megatron' not in sys.modules; "
            "from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device, get_resource_name; "
            "from verl.workers.rollout import get_rollout_class; "
            "from verl.workers.rollout.replica import get_rollout_replica_class; "
            "import verl.utils.distributed as vd; from mcore_dapo.patching import applied_ids; "
            "print(get_device_name(), get_nccl_backend(), get_resource_name(), get_torch_device().current_device(), "
            "get_rollout_class('hf_cpu', 'async').__name__, get_rollout_replica_class('hf_cpu').__name__, "
            "'verl.cpu.process-group' in applied_ids() "
            "and hasattr(vd.initialize_global_process_group_ray, '__wrapped__'))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["cpu", "gloo", "GPU", "cpu", "CpuServerAdapter", "CpuRolloutReplica", "True"]


@pytest.mark.no_accelerator
def test_cpu_platform_not_chosen_on_a_gpu_host_when_torch_has_cuda(monkeypatch, tmp_path):
    """A GPU host whose CUDA_VISIBLE_DEVICES hides every device (torch.cuda.is_available() False, as on this
    host): the adapters, verl's platform and the CPU patches all say CUDA host."""
    import torch

    from mcore_dapo import devices, host
    from mcore_dapo.patching.verl_cpu import process_group
    from mcore_dapo.verl_cpu import platform as platform_cpu

    assert devices.detect() == "cpu" and platform_cpu.cpu_platform_applies()
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build of torch
    monkeypatch.setattr(host, "NVIDIA_DRIVER", str(tmp_path))  # a GPU driver present
    assert not torch.cuda.is_available()
    assert devices.detect() == "cuda"
    assert not platform_cpu.cpu_platform_applies() and not process_group._on_cpu()
    # a CUDA build of torch on a host with no GPU at all (the Ascend stack's torch 2.7.1 here) computes on the CPU
    monkeypatch.setattr(host, "NVIDIA_DRIVER", str(tmp_path / "absent"))
    assert devices.detect() == "cpu" and platform_cpu.cpu_platform_applies() and process_group._on_cpu()


def test_devices_and_verls_platform_agree_when_cuda_visible_devices_hides_every_device():
    """In a clean process with CUDA_VISIBLE_DEVICES=\"\": the adapters' detection and the platform verl resolves
    name the same device (cpu on a CPU host; cuda on a GPU host, where the two disagreed before)."""
    code = ("from mcore_dapo.devices import detect; import verl; from verl.utils.device import get_device_name; "
            "print(detect(), get_device_name())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr[-2000:]
    detected, verl_device = p.stdout.split()[-2:]
    assert verl_device == detected


def test_rollout_sampling_rules(tmp_path):
    import torch
    from types import SimpleNamespace

    from mcore_dapo_checks.tiny import make_tiny_model
    from mcore_dapo.verl_cpu.rollout import response_budget, sample
    from transformers import AutoModelForCausalLM

    cfg = SimpleNamespace(max_model_len=None, prompt_length=8, response_length=6)
    assert response_budget(cfg, 5, {}) == 6
    assert response_budget(cfg, 10, {}) == 4  # prompt_length + response_length - prompt
    params = {"max_tokens": 100}
    assert response_budget(cfg, 5, params) == 9 and "max_tokens" not in params  # clamped to max_model_len
    with pytest.raises(ValueError, match="no room"):
        response_budget(cfg, 14, {})

    model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "m"), dtype=torch.float32).eval()
    prompt = [3, 5, 7, 9]
    greedy, lp, _ = sample(model, prompt, 5, temperature=0.0, want_logprobs=True)
    assert greedy == sample(model, prompt, 5, top_k=1)[0]  # top-1 sampling is greedy
    with torch.no_grad():  # the first token and its log-prob from a plain forward pass
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
    assert greedy[0] == int(logits.argmax())
    assert lp[0] == pytest.approx(float(torch.log_softmax(logits, -1).max()), abs=1e-5)
    stop = greedy[1]
    assert sample(model, prompt, 5, temperature=0.0, eos={stop})[0] == greedy[:greedy.index(stop) + 1]  # eos ends it
    g = torch.Generator().manual_seed(0)
    a = sample(model, prompt, 8, generator=g)[0]
    assert len(a) == 8 and a == sample(model, prompt, 8, generator=torch.Generator().manual_seed(0))[0]


def test_packing_and_attention_backend_are_the_devices_answers():
    from megatron.core.transformer.enums import AttnBackend
    from omegaconf import OmegaConf

    from mcore_dapo.devices import get_adapter
    from mcore_dapo.devices.cuda import te_available
    from mcore_dapo.verl_plugin.config_checks import check_packing
    from mcore_dapo.runtime.model import device_attention_backend

    def conf(device):
        return OmegaConf.create({"trainer": {"device": device},
                                 "actor_rollout_ref": {"model": {"use_remove_padding": True}}})

    check_packing(conf("cuda"), here=False)  # a dry run: Transformer Engine is the launching machine's question
    if not te_available():
        with pytest.raises(UserError, match="accepted on CUDA without Transformer Engine is "
                                            "actor_rollout_ref.model.use_remove_padding=False"):
            check_packing(conf("cuda"))
    for here in (True, False):  # the CPU refuses THD on any machine
        with pytest.raises(UserError, match="set actor_rollout_ref.model.use_remove_padding=False on the CPU"):
            check_packing(conf("cpu"), here=here)
    assert device_attention_backend({"attention_backend": "flash"}, get_adapter("cpu")) == {"attention_backend": AttnBackend.local}
    assert device_attention_backend({"attention_backend": "flash"}, get_adapter("cuda")) == {"attention_backend": AttnBackend.flash}
    assert device_attention_backend({}, get_adapter("cpu")) == {}
    with pytest.raises(UserError, match="attention_backend='flashy' is not accepted: accepted are"):
        device_attention_backend({"attention_backend": "flashy"}, get_adapter("cuda"))


def test_launch_on_cuda_without_transformer_engine_refuses_packing_before_ray(monkeypatch, capsys):
    """main_dapo's pre-flight: trainer.device=cuda with packed sequences where transformer_engine does not
    import is refused in one line, and verl's main_ppo (which starts Ray) is never called."""
    from mcore_dapo.devices.cuda import te_available
    from mcore_dapo.verl_plugin import main_dapo
    from verl.trainer import main_ppo

    if te_available():
        pytest.skip("transformer_engine imports here: packed sequences run on CUDA")

    def ray_would_start():
        raise AssertionError("main_ppo.main ran: Ray would start")

    monkeypatch.setattr(main_ppo, "main", ray_would_start)
    monkeypatch.setenv("MCORE_DAPO_MODEL_CONFIG", str(ROOT / "configs" / "models" / "qwen3-30b-a3b"))
    monkeypatch.delenv("DRY_RUN", raising=False)
    argv = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.path=absent",
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
            "trainer.device=cuda", "actor_rollout_ref.model.use_remove_padding=True"]
    assert main_dapo.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: actor_rollout_ref.model.use_remove_padding=True packs sequences (THD), which Megatron's "
                   "attention runs only with Transformer Engine, and transformer_engine does not import here: "
                   "accepted on CUDA without Transformer Engine is actor_rollout_ref.model.use_remove_padding=False "
                   "(or install Transformer Engine)"]
    # a dry run checks the config, names what this machine would refuse, and exits 0
    monkeypatch.setenv("DRY_RUN", "1")
    assert main_dapo.main(argv) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["device"] == "cuda" and got["refused_here"] == err[0][len("error: "):]
    # and a launch with use_remove_padding=False gets past the check to main_ppo (whose failure here is an
    # unexpected one: its traceback, then its type and message in one line, exit 1)
    monkeypatch.delenv("DRY_RUN")
    assert main_dapo.main([*argv[:-1], "actor_rollout_ref.model.use_remove_padding=False"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == "failed: AssertionError: main_ppo.main ran: Ray would start"


def test_a_checkpoint_of_the_other_optimizer_is_one_line_under_the_same_layout(tmp_path):
    """The distributed and the non-distributed optimizer lay their state out differently: a checkpoint of one is
    refused for the other before any load, also when the layout is the same (no resharding asked)."""
    import json

    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin import checkpoint as ck

    folder = tmp_path / "global_step_2" / "actor"
    folder.mkdir(parents=True)
    layout = {"tp": 1, "pp": 1, "ep": 2, "etp": 1, "cp": 1, "vpp": None, "world_size": 2}
    here = {"model": {"hidden_size": 64}, "layout": layout,
            "optimizer": {"distributed": True, "sharding_type": None}, "dtype": "bfloat16"}
    record = {**here, "format": ck.FORMAT, "files": {}, "optimizer": {"distributed": False, "sharding_type": None}}
    (folder / ck.RESUME_FILE).write_text(json.dumps(record))
    with pytest.raises(UserError) as e:
        ck.check(folder, here)
    msg = str(e.value)
    assert "\n" not in msg and "use_distributed_optimizer=False" in msg and "this run has True" in msg
    assert ck.check(folder, here, load_optimizer=False) is not None  # the weights alone still load


@pytest.mark.parametrize("writer", ["0.12.1", "0.16.1"])
def test_a_checkpoint_of_the_other_megatron_lines_optimizer_is_one_line(tmp_path, writer):
    """Each line saves the distributed optimizer in its formats (0.16.1: dp_reshardable, and fully_reshardable at
    chosen saves; 0.12.1: fully_sharded_model_space) and reads those only: the other line's checkpoint is refused
    before any load, naming both versions and what is accepted; the weights alone still load. Runs on both test
    stacks."""
    import json

    from mcore_dapo import versions
    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin import checkpoint as ck

    here_v = versions.installed("megatron-core")
    fmt = ck.optimizer_format(True, writer)
    folder = tmp_path / "global_step_2" / "actor"
    folder.mkdir(parents=True)
    layout = {"tp": 1, "pp": 1, "ep": 2, "etp": 1, "cp": 1, "vpp": None, "world_size": 2}
    here = {"model": {"hidden_size": 64}, "layout": layout,
            "optimizer": {"distributed": True, "sharding_type": ck.optimizer_format(True)}, "dtype": "bfloat16"}
    record = {**here, "format": ck.FORMAT, "files": {}, "written_by": {"megatron-core": writer},
              "optimizer": {"distributed": True, "sharding_type": fmt}}
    (folder / ck.RESUME_FILE).write_text(json.dumps(record))
    assert ck.readable_formats() == {ck.optimizer_format(True), ck.optimizer_format(True, reshardable=True)}
    if here_v.split(".")[:2] == writer.split(".")[:2]:
        assert ck.check(folder, here) is not None  # this line's own
        return
    with pytest.raises(UserError) as e:
        ck.check(folder, here)
    msg = str(e.value)
    assert "\n" not in msg and f"Megatron's {fmt} format" in msg and f"megatron-core {here_v} does not read" in msg
    accepted = ", ".join(sorted(ck.readable_formats()))
    assert f"written by megatron-core {writer}" in msg and f"accepted here: {accepted}" in msg
    assert ck.check(folder, here, load_optimizer=False) is not None


# On the Ascend line the first order alone (main_stack_only): the orders exercise verl 0.9.1's registries and this
# project's table, the same on both lines; the engine first is the one that imports the line's Megatron
@pytest.mark.parametrize("first", ["mcore_dapo.verl_plugin.engine", *(
    pytest.param(m, marks=pytest.mark.main_stack_only) for m in (
        "mcore_dapo.verl_plugin.checkpoint_manager", "mcore_dapo.verl_cpu.platform", "mcore_dapo.verl_cpu.replica"))])
def test_every_row_registered_whichever_class_module_is_imported_first(first):
    """A class module imported before verl is what imports verl and its registries, so the entry point's hook
    imports a module that is still executing: its classes register when their statements run, and every row is
    registered: the platform and the rollout before verl's engine package is imported, the engines after."""
    code = (f"import importlib, sys; importlib.import_module({first!r}); "
            "from verl.plugin.platform.platform_manager import PlatformRegistry; "
            "from verl.workers.rollout import base; from verl.workers.rollout.replica import RolloutReplicaRegistry; "
            "print(PlatformRegistry.get('cpu').__name__, base._ROLLOUT_REGISTRY.get(('hf_cpu', 'async')), "
            "RolloutReplicaRegistry.get('hf_cpu').__name__); import verl.workers.engine as e; "
            "r = e.EngineRegistry._engines['language_model']['megatron']; "
            "print(r['cpu'].__name__, r[('cuda', 'nvidia')].__name__, r[('npu', 'huawei')] is r[('cuda', 'nvidia')])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["PlatformCPU", "mcore_dapo.verl_cpu.replica.CpuServerAdapter", "CpuRolloutReplica",
                                "McoreDapoCpuEngine", "McoreDapoEngine", "True"]


REBUILT = """
import os, sys, torch, torch.distributed as dist
from omegaconf import OmegaConf
from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager
from mcore_dapo.verl_plugin.checkpoint_manager import McoreDapoCheckpointManager, constructor_arguments
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
base = MegatronCheckpointManager
if sys.argv[2] == "extra":  # a verl whose constructor takes an argument it does not keep under its name
    class base(MegatronCheckpointManager):
        def __init__(self, *a, new_setting=1, **kw):
            super().__init__(*a, **kw)
args = dict(config=OmegaConf.create({"model": {"path": "p"}}), checkpoint_config=OmegaConf.create(
    {"save_contents": ["optimizer"], "load_contents": ["optimizer"], "async_save": False}), model_config="mc",
    transformer_config="tc", role="actor", model=["m"], arch="a", hf_config="hc", param_dtype=torch.bfloat16,
    share_embeddings_and_output_weights=True, processing_class="pc", optimizer="o", optimizer_scheduler="s",
    use_distributed_optimizer=True, use_checkpoint_opt_param_scheduler=True, use_dist_checkpointing=True,
    use_megatron_fsdp=False, bridge="b", provider="pv", peft_cls="pf")
verl = base(**args)
try:
    new = McoreDapoCheckpointManager.rebuilt(verl, engine="e")
except RuntimeError as e:
    print("refused:", e); sys.exit(0)
same = sorted(k for k in vars(verl) if vars(verl)[k] is not vars(new).get(k) and vars(verl)[k] != vars(new).get(k))
print(type(new).__name__, same, new.engine, new.lr_scheduler)
"""


@pytest.mark.parametrize("verl_kind, want", [
    ("same", "McoreDapoCheckpointManager [] e s"),
    # verl's constructor checked against itself: the same on both lines (main_stack_only)
    pytest.param("extra", "refused: verl's MegatronCheckpointManager takes ['new_setting']",
                 marks=pytest.mark.main_stack_only),
])
def test_the_engine_rebuilds_verls_checkpoint_manager_from_its_own_arguments(verl_kind, want):
    """The plugin's manager is built from the arguments verl built its own with (every attribute the same), and a
    verl whose constructor takes an argument it does not keep is refused at the engine's start, not guessed."""
    port = str(29500 + os.getpid() % 1000)
    p = subprocess.run([sys.executable, "-c", REBUILT, port, verl_kind], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().startswith(want), p.stdout


PREPARED_FIRST = (
    "import sys, mcore_dapo.devices as d; seen = []; real = d.get_adapter\n"
    "class Watch:\n"
    "    def __init__(self, a): self.a = a\n"
    "    def prepare(self): seen.append('megatron' in sys.modules); return self.a.prepare()\n"
    "    def __getattr__(self, k): return getattr(self.a, k)\n"
    "d.get_adapter = lambda *a, **k: Watch(real(*a, **k))\n"
    "import verl; assert 'megatron' not in sys.modules; import verl.workers.engine\n"
    "print(seen[:1])")


def test_the_device_is_prepared_before_verls_engine_package_imports_megatron():
    """On Ascend MindSpeed's adaptor must be imported before Megatron, and verl's engine package imports Megatron
    (verl/workers/engine/__init__.py imports .megatron): the entry point prepares the device right before that
    package's code runs. The adapter is watched, not replaced: what it sees is whether Megatron was imported."""
    p = subprocess.run([sys.executable, "-c", PREPARED_FIRST], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["[False]"]
