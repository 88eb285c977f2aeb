"""verl's DAPO trainer end to end on the CPU, as the launch scripts run it: the overrides are those of
``configs/dapo/common.sh`` (its ``DAPO_ARGS``, composed by bash as the scripts compose them) with only the
keys of :func:`cpu_changes` changed (sizes, paths, device and process counts, the rollout's CPU-only
settings, no packed sequences); on are the scripts' dynamic batch sizes, distributed optimizer, LR
warm-up, full recompute, parameter and optimizer offload, validation, checkpoints with
``resume_mode=auto``, dynamic sampling and verl's own ``math_dapo`` reward.

``mcore-dapo tiny-dapo --workdir W --steps 4`` (or ``python -m mcore_dapo_checks.tiny_dapo``, the same command)

prepares ``W`` (:mod:`mcore_dapo_checks.math_task`: the tiny Qwen3-MoE taught the answer form, a
word-level tokenizer with a chat template, train/val parquet files in the guide's schema) and runs
``python -m mcore_dapo.verl_plugin.main_dapo <overrides>``, the scripts' entry point. verl writes its
metrics, one JSON line per step, to ``W/metrics.jsonl`` and its console log to ``W/train.log``;
``W/tiny_dapo.png`` plots reward, response length, throughput and the timing breakdown per step
(``mcore-dapo metrics`` reads the same log); it prints a table per step (``--json``: one object). A run that does
not finish in ``--timeout`` seconds is stopped with every process it started, and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mcore_dapo.launch_keys import TRAINER_MODES  # --trainer-mode: verl's mode -> the scripts' ASYNC
from mcore_dapo.resources import common_script, device_script

# the overlong buffer starts past 2 tokens: the taught model's answers (``Answer: N`` and the end of turn,
# 3 tokens) all pay the dapo reward manager's overlong penalty, 0.1 each, which scores below -1 show
MAX_PROMPT, MAX_RESPONSE, OVERLONG = 16, 12, 10
TRAIN_BSZ, N = 4, 4
ROLLOUTS = ("hf_cpu", "vllm")


REPLAY_MODES = ("off", "R2", "R3")  # --router-replay; the mode itself is the scripts' ROUTER_REPLAY

# separate_async on the CPU: the rollout's own pool, one slot (one hf_cpu or vLLM server process)
ROLLOUT_SLOTS = 1


# rollouts that return the routed experts of what they generate on the CPU (vLLM's CPU build cannot:
# enable_return_routed_experts needs its Model Runner V2, which needs Triton)
ROUTES_ON_CPU = ("hf_cpu",)


def replay_overrides(router_replay: str | None, rollout_dtype: str | None = None, rollout: str = "hf_cpu") -> list[str]:
    """What ``--router-replay`` and ``--rollout-dtype`` add to the scripts' settings: the rollout's dtype, and
    the rollout returning its routed experts where it can without replaying them (R2, off: the
    routing-agreement metric). The replay mode itself is the scripts' ``ROUTER_REPLAY`` (:func:`overrides`)."""
    from mcore_dapo.errors import UserError

    out = [f"actor_rollout_ref.rollout.dtype={rollout_dtype}"] if rollout_dtype else []
    if router_replay is None:
        return out
    if router_replay not in REPLAY_MODES:
        raise UserError(f"--router-replay={router_replay!r} is not accepted: accepted are {', '.join(REPLAY_MODES)}")
    if rollout not in ROUTES_ON_CPU:
        if router_replay == "R3":
            raise UserError(f"--router-replay R3 with --rollout {rollout}: R3 replays the rollout's routed experts, "
                            "which vLLM's CPU build cannot return (its Model Runner V2 needs Triton); accepted on "
                            "the CPU is --rollout hf_cpu")
        return out
    if router_replay != "R3":  # R3: the scripts' REPLAY_ARGS turn it on
        out.append("actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    return out


SCRIPT = common_script()

# What the CPU run changes of configs/dapo/common.sh's DAPO_ARGS, by key, and why. Only these kinds:
# sizes (lengths, batch sizes, n, token budgets, steps), device and process counts, the rollout's CPU-only
# settings, and packing (no packed attention without Transformer Engine); paths come in through the
# scripts' own variables (script_env). Everything else is the scripts' (tests/test_tiny_dapo_cli.py fails
# on any other difference).
SIZES, COUNTS, ROLLOUT_CPU, PACKING = "size", "device and process counts", "rollout on the CPU", "packing"
TOKEN_BUDGET = 2 * (MAX_PROMPT + MAX_RESPONSE)  # a data-parallel rank's 8 sequences split into ~4 micro-batches


def script_env(files: dict, workdir: Path, gen_tp: int = 1, trainer_mode: str = "sync", gen_ep: int = 1,
               rollout_correction: str | None = None) -> dict:
    """The variables a device script sets before sourcing common.sh, for the CPU run (``gen_tp``: the
    rollout's tensor-parallel size, the scripts' GEN_TP=2 where the rollout runs it on the CPU; ``gen_ep``: its
    expert-parallel size, GEN_EP; ``trainer_mode``:
    the scripts' ASYNC, with separate_async's rollout on a node of its own, ROLLOUT_SLOTS slots, and the CPU
    adapter's checkpoint engine; ``rollout_correction``: the scripts' ROLLOUT_CORRECTION, None for their default)."""
    env = {"NNODES": "1", "DEVICE": "cpu", "MODEL_PATH": str(files["model"]), "CKPTS_DIR": str(workdir / "checkpoints"),
           "TRAIN_FILE": str(files["train"]), "TEST_FILE": str(files["val"]), "GEN_TP": str(gen_tp),
           "GEN_EP": str(gen_ep), "INFER_MAX_TOKENS": str(TOKEN_BUDGET), "ENFORCE_EAGER": "True",
           # the guide's console logger, and verl's file logger for the metrics this harness reads
           "LOGGER": '["console","file"]', "ASYNC": TRAINER_MODES[trainer_mode]}
    if rollout_correction is not None:
        env["ROLLOUT_CORRECTION"] = rollout_correction
    if trainer_mode == "separate_async":
        from mcore_dapo.devices import get_adapter

        backend, module = get_adapter("cpu").rollout.checkpoint_engine()
        env.update(NNODES="2", ROLLOUT_NNODES="1", ROLLOUT_GPUS_PER_NODE=str(ROLLOUT_SLOTS), CKPT_ENGINE=backend,
                   CKPT_ENGINE_MODULE=module or "")
    return env


WARMUP = 1  # the CPU run's LR warm-up (steps): its first update applies lr 0, the next ones the full rate


def cpu_changes(files: dict, workdir: Path, steps: int, lr: float, rollout: str,
                layout: str = "ep2", trainer_mode: str = "sync") -> dict[str, tuple[str, str]]:
    """key -> (the CPU run's value, the kind of change); a key the scripts do not set is added."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    world = LAYOUT_CLASSES[layout]["world"]
    slots = world + (ROLLOUT_SLOTS if trainer_mode == "separate_async" else 0)
    out = {
        "data.max_prompt_length": (MAX_PROMPT, SIZES), "data.max_response_length": (MAX_RESPONSE, SIZES),
        "data.train_batch_size": (TRAIN_BSZ, SIZES), f"{r}.n": (N, SIZES),
        f"{a}.ppo_mini_batch_size": (TRAIN_BSZ, SIZES), f"{a}.ppo_max_token_len_per_gpu": (TOKEN_BUDGET, SIZES),
        f"{r}.max_num_seqs": (TRAIN_BSZ * N * 3, SIZES),
        f"{r}.max_num_batched_tokens": ((MAX_PROMPT + MAX_RESPONSE) * TRAIN_BSZ * N * 3, SIZES),
        # a model 10^5 times smaller than the real one, trained for a few steps: a larger rate, a shorter warm-up
        f"{a}.optim.lr": (lr, SIZES), f"{a}.optim.lr_warmup_steps": (WARMUP, SIZES),
        "reward.reward_kwargs.max_resp_len": (MAX_RESPONSE, SIZES),
        "reward.reward_kwargs.overlong_buffer_cfg.len": (OVERLONG, SIZES),
        "trainer.test_freq": (2, SIZES), "trainer.save_freq": (2, SIZES), "trainer.total_training_steps": (steps, SIZES),
        "trainer.n_gpus_per_node": (world, COUNTS), "data.dataloader_num_workers": (0, COUNTS),
        # Ray on a laptop: logical CPUs for verl's many small actors, a logical GPU slot for each trainer
        # process (the plugin's cpu platform counts trainer slots as Ray's GPU resource)
        "ray_kwargs.ray_init.num_cpus": (32, COUNTS), "ray_kwargs.ray_init.num_gpus": (slots, COUNTS),
        "ray_kwargs.ray_init.include_dashboard": (False, COUNTS),
        "transfer_queue.backend.SimpleStorage.num_data_storage_units": (1, COUNTS),
        f"{r}.agent.num_workers": (1, COUNTS),
        # Megatron's attention without Transformer Engine has no THD (packed) kernel: padded batches
        "actor_rollout_ref.model.use_remove_padding": (False, PACKING),
        f"{r}.free_cache_engine": (False, ROLLOUT_CPU),  # needs the rollout's sleep mode, which the CPU has not
    }
    for key, value in rollout_settings(rollout).items():
        out[key] = (value, ROLLOUT_CPU)
    for key, value in LAYOUT_CLASSES[layout]["changes"].items():  # the script's layout at tiny size
        for role in ("actor", "ref"):
            if key.startswith("override_transformer_config.") and role == "ref":
                continue  # the ref's follows the actor's (verl's megatron_ref.yaml)
            out[f"actor_rollout_ref.{role}.megatron.{key}"] = (value, SIZES if "layers" in key else COUNTS)
    return out


def rollout_settings(rollout: str) -> dict:
    """``hf_cpu`` (the plugin's HF stand-in) or verl's own ``vllm`` rollout on vLLM's CPU build."""
    r = "actor_rollout_ref.rollout"
    if rollout == "hf_cpu":
        return {f"{r}.name": "hf_cpu", f"{r}.enable_chunked_prefill": False}
    return {f"{r}.name": "vllm", f"{r}.load_format": "dummy", f"{r}.max_model_len": MAX_PROMPT + MAX_RESPONSE,
            f"{r}.enable_chunked_prefill": False, f"{r}.enable_prefix_caching": False,
            f"{r}.checkpoint_engine.update_weights_bucket_megabytes": 16,
            # not in verl's rollout.yaml (a RolloutConfig field); vLLM's CPU platform refuses sleep mode
            f"{r}.enable_sleep_mode": False}


def script_args(env: dict, layout: list[str], router_replay: str | None = None) -> list[str]:
    """configs/dapo/common.sh's DAPO_ARGS as the launch scripts pass them (bash sources it), for ``env``'s
    variables and the ``layout`` overrides (a script's LAYOUT array)."""
    if not SCRIPT.is_file():
        from mcore_dapo.errors import UserError

        raise UserError(f"{SCRIPT} is missing: the CPU trainer run composes its settings from the launch scripts")
    quoted = " ".join("'" + x.replace("'", "'\\''") + "'" for x in layout)
    cmd = f'LAYOUT=({quoted}); source "{SCRIPT}"; printf "%s\\0" "${{DAPO_ARGS[@]}}"'
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True,
                       env={**os.environ, **env, "ROUTER_REPLAY": router_replay or "off"})
    return [x for x in p.stdout.split("\0") if x]


def key_of(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+")


# The layouts of the CPU runs. "ep2": EP2 alone, on 2 ranks. "h100" and "a2": the device script's own LAYOUT
# array (configs/dapo_qwen3_30b_<device>.sh, read by bash), with only its counts and stage sizes changed for
# the tiny model: the H100 class (TP2 with sequence parallelism, EP over the TP ranks with ETP1, full
# recompute) on 2 ranks; the A2 class (PP2 with VPP2 and uneven stages, EP, full recompute) on 4 ranks and an
# 8-layer model, the script's 26 + 22 layers as 6 + 2 (two virtual stages of 3 in the first stage, of 1 in
# the last).
LAYOUT_CLASSES = {
    "ep2": {"world": 2, "layers": 4, "changes": {}},
    "h100": {"world": 2, "layers": 4, "changes": {"expert_model_parallel_size": 2}},
    # the H100 class on 4 ranks: data-parallel size 2 and expert data-parallel size 2 (TP2 x DP2; EP2 x ETP1 x
    # expert DP2), so that the distributed optimizer shards and the update reduces over data-parallel ranks
    "h100-dp2": {"world": 4, "layers": 4, "changes": {"expert_model_parallel_size": 2}, "script": "h100"},
    "a2": {"world": 4, "layers": 8, "changes": {
        "expert_model_parallel_size": 2,
        "override_transformer_config.num_layers_in_first_pipeline_stage": 6,
        "override_transformer_config.num_layers_in_last_pipeline_stage": 2}},
}


def script_layout(device: str) -> list[str]:
    """The LAYOUT array of ``configs/dapo_qwen3_30b_<device>.sh`` as bash builds it: the script's text from
    ``LAYOUT=()`` to its first ``export`` or ``source`` line (its environment and the launch)."""
    from mcore_dapo.errors import UserError

    path = device_script(device)
    text = path.read_text() if path.is_file() else ""
    start = text.find("\nLAYOUT=()")
    ends = [i for i in (text.find("\nexport ", start), text.find("\nsource ", start)) if i > start]
    if start < 0 or not ends:
        raise UserError(f"{path} has no LAYOUT=() block before its export/source lines: the CPU run reads the "
                        "script's layout from it")
    block = text[start:min(ends)]
    p = subprocess.run(["bash", "-c", block + '\nprintf "%s\\0" "${LAYOUT[@]}"'], capture_output=True, text=True,
                       check=True)
    return [x for x in p.stdout.split("\0") if x]


def layout_overrides(ep: int = 2) -> list[str]:
    from mcore_dapo.bridge.layout import Layout

    return [x for role in ("actor", "ref") for x in Layout(ep=ep, etp=1).hydra_overrides(f"actor_rollout_ref.{role}.megatron")]


def layout_args(layout: str) -> list[str]:
    """The LAYOUT array the scripts' arguments are composed with: the device script's, or EP2 alone."""
    if layout not in LAYOUT_CLASSES:
        from mcore_dapo.errors import accepted

        raise accepted("--layout", layout, ", ".join(LAYOUT_CLASSES))
    return layout_overrides(2) if layout == "ep2" else script_layout(LAYOUT_CLASSES[layout].get("script", layout))


def check_trainer_mode(trainer_mode: str) -> None:
    if trainer_mode not in TRAINER_MODES:
        from mcore_dapo.errors import accepted

        raise accepted("--trainer-mode", trainer_mode, ", ".join(TRAINER_MODES))


def overrides(files: dict, workdir: Path, steps: int, lr: float = 1e-3, rollout: str = "hf_cpu",
              router_replay: str | None = None, layout: str = "ep2", gen_tp: int = 1,
              trainer_mode: str = "sync", gen_ep: int = 1, rollout_correction: str | None = None) -> list[str]:
    """configs/dapo/common.sh's overrides, with :func:`cpu_changes` (and nothing else) changed or added."""
    mode = router_replay if router_replay in ("R2", "R3") else None
    check_trainer_mode(trainer_mode)
    args = script_args(script_env(files, workdir, gen_tp, trainer_mode, gen_ep, rollout_correction),
                       layout_args(layout), mode)
    changes = cpu_changes(files, workdir, steps, lr, rollout, layout, trainer_mode)
    out, seen = [], set()
    for arg in args:
        key = key_of(arg)
        if key in changes:
            prefix = arg[: len(arg) - len(arg.lstrip("+"))]
            out.append(f"{prefix}{key}={changes[key][0]}")
            seen.add(key)
        else:
            out.append(arg)
    # keys the scripts leave to verl's defaults: '+' adds a key verl's config does not declare
    out += [f"{'+' if key in UNDECLARED else ''}{key}={value}" for key, (value, _) in changes.items() if key not in seen]
    return out


# keys verl 0.9.1's config does not declare (Hydra's '+' adds them)
UNDECLARED = {"ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.include_dashboard",
              "actor_rollout_ref.rollout.enable_sleep_mode"}


# the settings of the run's Hydra overrides that the audit's reference loss needs, by verl key
LOSS_KEYS = {"use_kl_loss": "actor_rollout_ref.actor.use_kl_loss", "kl_loss_coef": "actor_rollout_ref.actor.kl_loss_coef",
             "kl_loss_type": "actor_rollout_ref.actor.kl_loss_type",
             "rollout_is_threshold": "algorithm.rollout_correction.rollout_is_threshold",
             "bypass_mode": "algorithm.rollout_correction.bypass_mode"}


def loss_settings(args: list[str]) -> dict:
    """What the run's overrides set of :data:`LOSS_KEYS` (the last value of a key wins, as in Hydra); keys they leave
    to verl's defaults are absent (the reference takes verl's, :data:`mcore_dapo_checks.audit_reference.LOSS_DEFAULTS`)."""
    import yaml

    values = {key_of(a): a.split("=", 1)[1] for a in args if "=" in a}
    return {name: yaml.safe_load(values[key]) for name, key in LOSS_KEYS.items() if key in values}


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a run's log, for a failure message ("" when the run wrote none)."""
    path = Path(path)
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def run(workdir: Path, steps: int, timeout: float, lr: float = 1e-3, audit: bool = False,
        rollout: str = "hf_cpu", router_replay: str | None = None, rollout_dtype: str | None = None,
        extra: tuple[str, ...] = (), teach_p: float | None = None, layout: str = "ep2", gen_tp: int = 1,
        kill_when=None, trainer_mode: str = "sync", gen_ep: int = 1, rollout_correction: str | None = None) -> dict:
    """``audit``: every update is recomputed afterwards on the HF model from the engine's weights of
    that step (:mod:`mcore_dapo_checks.audit`); the result gets, per step, the engine's and the
    reference's loss and gradient norm, the learning rate and the weights after the update compared.
    ``extra``: Hydra overrides after the scripts' (a variant of their settings, such as KL on); ``teach_p``:
    the taught model's share of right answers (:func:`mcore_dapo_checks.math_task.prepare`); ``layout``: one of
    :data:`LAYOUT_CLASSES` (a device script's layout at tiny size); ``gen_tp``, ``gen_ep``: the rollout's tensor- and
    expert-parallel sizes; ``rollout_correction``: the scripts' ROLLOUT_CORRECTION (None: their default);
    ``kill_when``: every process of the trainer is SIGKILLed once it returns True (:func:`run_session`)."""
    import shutil

    workdir = Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    audit_dir = workdir / "audit"
    shutil.rmtree(audit_dir, ignore_errors=True)
    from mcore_dapo_checks.math_task import prepare as prepare_math

    layout_args(layout)  # an unknown layout or mode is refused before anything is prepared
    check_trainer_mode(trainer_mode)
    files = prepare_math(workdir, rollout, layers=LAYOUT_CLASSES[layout]["layers"], rollout_tp=gen_tp,
                         **({} if teach_p is None else {"p_right": teach_p}))
    log = workdir / "metrics.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log), "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if gen_tp > 1:
        # vLLM's CPU workers bind their OpenMP threads one NUMA node each (vllm/utils/ompmultiprocessing.py),
        # and refuse more workers than nodes: a one-node host runs the rollout's TP ranks unbound
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    more = replay_overrides(router_replay, rollout_dtype, rollout)
    cmd = [sys.executable, "-m", "mcore_dapo.verl_plugin.main_dapo",
           *overrides(files, workdir, steps, lr=lr, rollout=rollout, router_replay=router_replay, layout=layout,
                      gen_tp=gen_tp, trainer_mode=trainer_mode, gen_ep=gen_ep, rollout_correction=rollout_correction),
           *more, *extra]
    if audit:
        from mcore_dapo_checks.audit import audit_env

        env.update(audit_env(audit_dir))
        audit_dir.mkdir(parents=True)
        (audit_dir / "settings.json").write_text(json.dumps(loss_settings(cmd[3:])))
    t0 = time.time()
    returncode, error = run_bounded(cmd, workdir, env, timeout, steps, kill_when)
    records = read_metrics(log)
    result = {"returncode": returncode, "error": error, "rollout": rollout, "layout": layout, "gen_tp": gen_tp, "gen_ep": gen_ep,
              "trainer_mode": trainer_mode,
              "seconds": round(time.time() - t0, 1),
              "steps": len(records),
              "metrics_log": str(log), "train_log": str(workdir / "train.log"),
              "last": records[-1]["data"] if records else None}
    if records:
        result["plot"] = str(plot(workdir / "train.log", workdir / "tiny_dapo.png", layout))
    if audit and returncode == 0:
        from mcore_dapo_checks.audit_reference import reference

        result["audit"] = reference(audit_dir)
    return result


def run_bounded(cmd: list[str], workdir: Path, env: dict, timeout: float, steps: int,
                kill_when=None) -> tuple[int | None, str | None]:
    """Run verl's trainer in its own session; past ``timeout`` it is stopped with every process it started
    (Ray's too), and the reason comes back as one line: verl 0.9.1 ignores ``max_num_gen_batches``, so a run
    whose groups all score alike regenerates without end."""
    from mcore_dapo.runtime.launch import run_session

    with open(workdir / "train.log", "w") as out:
        returncode = run_session(cmd, env, out, timeout, cwd=workdir, kill_when=kill_when)
    if returncode is not None:
        return returncode, None
    return None, (f"verl's trainer did not finish {steps} steps in {timeout:.0f} s and was stopped (with "
                  "filter_groups, verl 0.9.1 regenerates without end while every group scores alike; see "
                  f"{workdir / 'train.log'})")


def per_step(result: dict) -> list[dict]:
    """Per step: verl's score, the engine's grad norm, the audit's HF grad norm and verdict, verl's rollout-vs-actor
    max |dp|."""
    from mcore_dapo.metrics.plot import validation_accuracy_key

    records = read_metrics(Path(result["metrics_log"]))
    rows = [r["data"] for r in records]
    val = validation_accuracy_key({"run": dict(enumerate(rows))})
    audit = result.get("audit") or []
    from mcore_dapo_checks.audit_verdict import verdicts

    judged = verdicts(audit) if audit else []
    # the global step verl logged (a resumed run's first step is the checkpoint's plus one), not the line's number
    return [{"step": int(records[i].get("step", i + 1)), "score": m.get("critic/score/mean"), "grad_norm": m.get("actor/grad_norm"),
             "reference_grad_norm": audit[i]["reference_grad_norm"] if i < len(audit) else None,
             # the checks the audited update fails (mcore_dapo_checks.audit_verdict, as the tests judge it)
             "audit_misses": judged[i] if i < len(judged) else None,
             "evicted": m.get("training/filter_groups/evicted_samples", 0),
             "rollout_vs_actor": m.get("training/rollout_probs_diff_max"),
             "routing_agreement": m.get("actor/routing/rollout_agreement"), "seconds": m.get("timing_s/step"),
             "val_acc": m.get(val) if val else None,
             # the asynchronous modes: how many weight versions the step's samples lag the policy trained (verl's)
             "staleness": m.get("training/off_policy/trajectory_staleness_worst/max")}
            for i, m in enumerate(rows)]


LAYOUT_TITLES = {"ep2": "EP2", "h100": "TP2+SP, EP2 (the H100 script's class)",
                 "h100-dp2": "TP2+SP x DP2, EP2 x EDP2 (the H100 script's class)",
                 "a2": "PP2 6/2 x VPP2, EP2 (the A2 script's class)"}


def plot(train_log: Path, out: Path, layout: str = "ep2") -> Path:
    """Reward, response length, the guide's e2e throughput and the timing breakdown per step."""
    from mcore_dapo.metrics import Batch, read_run, with_throughputs
    from mcore_dapo.metrics.plot import plot_runs

    batch = Batch(world_size=LAYOUT_CLASSES[layout]["world"], prompts=TRAIN_BSZ, responses_per_prompt=N)
    return plot_runs({f"tiny DAPO, Megatron {LAYOUT_TITLES[layout]} (CPU)": with_throughputs(read_run(train_log), batch)},
                     out)


def main(argv=None) -> int:
    """``python -m mcore_dapo_checks.tiny_dapo ARGS`` is ``mcore-dapo tiny-dapo ARGS`` (one entry point)."""
    from mcore_dapo.cli.main import run as cli

    return cli(["tiny-dapo", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
