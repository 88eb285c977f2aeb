"""The plugin's own checks of a composed verl config; each failure is one :class:`UserError` line."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from mcore_dapo import megatron_compat
from mcore_dapo.bridge import Layout, load_hf_config
from mcore_dapo.bridge.models import architectures
from mcore_dapo.devices import get_adapter
from mcore_dapo.errors import UserError
from mcore_dapo.launch_keys import TRAINER_MODES

PACKING = "actor_rollout_ref.model.use_remove_padding"  # True: verl packs sequences (THD)


def check_verl_version(version: str) -> None:
    from mcore_dapo.verl_plugin import verl_version_ok
    from mcore_dapo.versions import SUPPORTED_VERL

    if not verl_version_ok(version):
        raise UserError(unsupported_verl(version, SUPPORTED_VERL))


def unsupported_verl(version: str, supported: str) -> str:
    """One line: why this verl cannot run the plugin, and the upgrade path (docs/ASCEND.md, 'verl 0.6.x')."""
    from mcore_dapo.versions import version_in

    why = ""
    if version_in(version, "<0.9"):
        # verl 0.6.x: trainer/main_ppo.py sends actor.strategy=megatron to workers/megatron_workers.py, which
        # builds, loads and syncs the model itself; the engine registry is not on that path, and verl
        # loads no `verl.plugins` entry points
        why = (" (its actor.strategy=megatron runs verl/workers/megatron_workers.py, not the engine API this "
               "plugin registers with)")
    return (f"verl {version} is not supported by mcore_dapo.verl_plugin{why}: supported is verl{supported}; "
            "upgrade with pip install verl==0.9.1")


def check_architecture(model_dir) -> object:
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"{cfg_path} does not exist: actor_rollout_ref.model.path must be a Hugging Face model folder")
    cfg = load_hf_config(model_dir)
    archs = list(cfg.raw.get("architectures") or [])
    supported = architectures()  # the registered models' (bridge/models)
    if not any(a in supported for a in archs):
        raise UserError(f"architecture {archs} is not supported by mcore_dapo: supported are {', '.join(supported)}")
    return cfg


def check_layouts(cfg, actor: Layout, ref: Layout | None, world: int) -> None:
    actor.validate(cfg, world)
    if ref is not None and ref != actor:
        raise UserError(
            f"actor layout {actor.describe()} and ref layout {ref.describe()} differ: verl initialises Megatron's "
            "parallel state once per worker, so set actor_rollout_ref.ref.megatron.* equal to the actor's"
        )


def check_batches(c, dp: int, world: int) -> None:
    actor, rollout, data = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout, c.data
    n = int(rollout.n)
    mini = int(actor.ppo_mini_batch_size)
    if int(data.train_batch_size) < mini:
        raise UserError(f"data.train_batch_size={data.train_batch_size} is below actor ppo_mini_batch_size={mini}")
    if (mini * n) % dp:
        raise UserError(f"ppo_mini_batch_size*rollout.n = {mini * n} is not divisible by the data-parallel size {dp}")
    micro = actor.get("ppo_micro_batch_size_per_gpu")
    if not actor.get("use_dynamic_bsz") and micro and (mini * n // dp) % int(micro):
        raise UserError(f"ppo_micro_batch_size_per_gpu={micro} does not divide the per-rank mini batch {mini * n // dp}")
    tp = int(rollout.tensor_model_parallel_size)
    if world % tp or int(c.trainer.n_gpus_per_node) % tp:
        raise UserError(f"rollout tensor_model_parallel_size={tp} must divide the devices per node and the world size {world}")


def check_packing(c, here: bool = True) -> None:
    """Packed sequences only on a trainer device that runs them. ``here``: also the refusals that depend on
    what this machine has installed (CUDA without Transformer Engine), which main_dapo checks before Ray
    starts on a launch (verl's workers run the launching machine's stack); a dry run (``here=False``) may
    run elsewhere and checks only the device's own refusal (the CPU's)."""
    device = c.trainer.get("device")
    if not device or not c.actor_rollout_ref.model.get("use_remove_padding", False):
        return
    adapter = get_adapter(str(device))
    if here or not adapter.fast.packed_sequences_need_installed_software:
        adapter.fast.check_packed_sequences(PACKING)


def check_fast_paths(c, cfg, layout: Layout, here: bool = True) -> None:
    """A fast path asked in the actor's ``override_transformer_config`` that the trainer device cannot run
    (grouped GEMM on CUDA without Transformer Engine, router fusion with router replay, MindSpeed's
    all-to-all overlap at EP 1): one line. ``here`` as in :func:`check_packing`: what depends on this
    machine's software only on a launch, where the device's one warning line names what it loses (CUDA
    without Transformer Engine)."""
    device = c.trainer.get("device")
    if not device:
        return
    megatron = c.actor_rollout_ref.actor.megatron
    overrides = dict(megatron.get("override_transformer_config") or {})
    replay = str(megatron.get("router_replay", {}).get("mode", "disabled")) != "disabled"
    adapter, kw = get_adapter(str(device)), dict(replay=replay,
                                                 dispatcher=overrides.get("moe_token_dispatcher_type") or "alltoall")
    adapter.fast.check_overrides(cfg, layout, overrides, here=here, **kw)
    if here and (warning := adapter.fast.warning(cfg, layout, **kw)):  # what this machine's software loses
        import logging

        logging.getLogger("mcore_dapo").warning(warning)


def validate(c, model_dir=None, here: bool = True) -> dict:
    """Check a composed verl config for the Megatron path; return the resolved parallel sizes.
    ``here=False`` (a dry run): what this machine's software would refuse on a launch is returned as
    ``refused_here`` instead of raised."""
    import verl

    check_verl_version(verl.__version__)
    actor = c.actor_rollout_ref.actor
    if actor.strategy != "megatron" or "megatron" not in actor:
        raise UserError(f"actor_rollout_ref.actor.strategy={actor.strategy} with {actor._target_}: "
                        "use actor_rollout_ref.actor.strategy=megatron through mcore_dapo.verl_plugin.main_dapo")
    world = int(c.trainer.nnodes) * int(c.trainer.n_gpus_per_node)
    cfg = check_architecture(model_dir or c.actor_rollout_ref.model.path)
    layout = Layout.from_megatron(actor.megatron)
    ref = c.actor_rollout_ref.get("ref")
    ref_layout = Layout.from_megatron(ref.megatron) if ref is not None and "megatron" in ref else None
    check_layouts(cfg, layout, ref_layout, world)
    dp = layout.dp(world)
    check_batches(c, dp, world)
    from mcore_dapo.verl_plugin import model_settings

    model_settings.check(c, cfg)
    check_packing(c, here)
    check_fast_paths(c, cfg, layout, here)
    replay = check_router_replay(c, cfg)
    mode = check_async(c)
    rollout = check_rollout_layout(c, cfg, world, mode)
    graph = check_rollout_graph(c)
    precision = check_rollout_precision(c)
    check_lr_schedule(c, mode)
    sizes = {**layout.as_dict(), "dp": dp, "edp": layout.expert_dp(world), "world_size": world,
             **rollout, "rollout_graph": graph, **precision,
             "device": str(c.trainer.get("device") or ""), "router_replay": replay, "trainer_mode": mode}
    if not here:
        try:
            check_packing(c, here=True)
            check_fast_paths(c, cfg, layout, here=True)
        except UserError as e:
            sizes["refused_here"] = str(e)
    return sizes


OPTIM = "actor_rollout_ref.actor.optim"


def check_lr_schedule(c, mode: str) -> int | None:
    """The LR warm-up must end before the schedule's last step, as Megatron's ``OptimizerParamScheduler``
    asserts (``lr_warmup_steps < lr_decay_steps``) in every trainer worker. The horizon is verl's
    (verl/utils/megatron/optimizer.py): ``optim.lr_decay_steps``, else ``optim.total_training_steps``, which
    verl's v1 trainer sets to ``trainer.total_training_steps`` (when given) x the mode's
    ``parameter_sync_step`` (verl/trainer/ppo/v1/trainer_base.py); the warm-up is ``lr_warmup_steps``, or
    ``int(lr_warmup_steps_ratio x horizon)`` when that is unset or <= 0. Without ``lr_decay_steps`` and
    ``trainer.total_training_steps`` the horizon is ``len(dataset) // train_batch_size x total_epochs``, known
    only once verl has loaded and filtered the data inside Ray: then only a ratio of 1 or more is refused.
    Returns the horizon, None where unknown."""
    optim, trainer = c.actor_rollout_ref.actor.optim, c.trainer
    decay, total = optim.get("lr_decay_steps"), trainer.get("total_training_steps")
    warmup, ratio = optim.get("lr_warmup_steps"), optim.get("lr_warmup_steps_ratio")
    from_ratio = ratio is not None and (warmup is None or int(warmup) <= 0)
    sync = 1
    if bool(trainer.get("use_v1", True)):
        sync = int(trainer.get("v1", {}).get(mode, {}).get("parameter_sync_step", 1) or 1)
    if decay is not None:
        horizon, named = int(decay), f"{OPTIM}.lr_decay_steps={decay}"
        fix = f"{OPTIM}.lr_decay_steps above {{w}}"
    elif total is not None:
        horizon = int(total) * sync
        named = f"trainer.total_training_steps={total}" + (
            f" x trainer.v1.{mode}.parameter_sync_step={sync}" if sync > 1 else "")
        fix = "trainer.total_training_steps above {t}"
    else:
        horizon = None
    if from_ratio and float(ratio) >= 1:
        raise UserError(f"{OPTIM}.lr_warmup_steps_ratio={ratio} (with lr_warmup_steps={warmup}) makes the warm-up "
                        "as long as the run: Megatron's OptimizerParamScheduler asserts lr_warmup_steps < "
                        "lr_decay_steps; accepted is a ratio below 1")
    if horizon is None:
        return None
    if horizon < 1:
        raise UserError(f"{named} leaves the LR schedule no step (Megatron's OptimizerParamScheduler asserts "
                        "lr_decay_steps > 0); accepted is at least 1")
    steps = int(float(ratio) * horizon) if from_ratio else (-1 if warmup is None else int(warmup))
    if steps < horizon:
        return horizon
    what = (f"{OPTIM}.lr_warmup_steps_ratio={ratio} (int({ratio} x {horizon}) = {steps} warm-up steps, "
            f"lr_warmup_steps={warmup})" if from_ratio else f"{OPTIM}.lr_warmup_steps={warmup}")
    accepted = f"accepted is {OPTIM}.lr_warmup_steps below {horizon}"
    if not from_ratio:
        accepted += " (or <= 0 with lr_warmup_steps_ratio below 1)"
        accepted += ", or " + fix.format(w=steps, t=steps // sync)
    raise UserError(f"{what} with {named}: the warm-up does not end within the run's {horizon} scheduler steps "
                    f"(Megatron's OptimizerParamScheduler asserts lr_warmup_steps < lr_decay_steps, inside a Ray "
                    f"worker); {accepted}")


def check_router_replay(c, cfg) -> str:
    """``actor.megatron.router_replay.mode``: R2/R3 need MoE layers; R3 replays the rollout's routes,
    so the rollout must return them (``rollout.enable_rollout_routing_replay``: vLLM's
    ``enable_return_routed_experts``). Without that R3 would have nothing to replay."""
    replay = str(c.actor_rollout_ref.actor.megatron.get("router_replay", {}).get("mode", "disabled"))
    if replay == "disabled":
        return replay
    if not cfg.is_moe:
        raise UserError(f"router_replay.mode={replay} needs a model with MoE layers; this one has none; "
                        "accepted with it is router_replay.mode=disabled")
    installed = _megatron_version()
    if installed is not None and Version(installed) < Version(megatron_compat.ROUTING_REPLAY_SINCE):
        raise UserError(megatron_compat.routing_replay_refusal(replay, installed))
    if replay == "R3" and not c.actor_rollout_ref.rollout.get("enable_rollout_routing_replay", False):
        raise UserError("router_replay.mode=R3 replays the rollout's routed experts, and the rollout does not "
                        "return them: set actor_rollout_ref.rollout.enable_rollout_routing_replay=True")
    return replay


ROLLOUT = "actor_rollout_ref.rollout"


def check_rollout_layout(c, cfg, world: int, mode: str) -> dict:
    """The vLLM rollout's TP x DP x EP (docs/VERL_PLUGIN.md, "Rollout layout and graph mode"), before Ray: what
    verl 0.9.1 asserts inside its Ray actors or silently leaves idle, and what vLLM refuses for the model's
    heads; one line each. Returns the rollout sizes of the dry run's JSON line."""
    r = c.actor_rollout_ref.rollout
    tp, dp, ep = (int(r.get(k) or 1) for k in ("tensor_model_parallel_size", "data_parallel_size",
                                                "expert_parallel_size"))
    for key, v in (("data_parallel_size", dp), ("expert_parallel_size", ep)):
        if v < 1:
            raise UserError(f"{ROLLOUT}.{key}={v} is not accepted: accepted is a positive integer")
    # verl/workers/config/rollout.py, RolloutConfig.__post_init__ (vLLM and SGLang): "expert_parallel_size must be
    # equal to tensor_model_parallel_size * data_parallel_size"; EP 1 keeps the experts tensor-split
    if ep != 1 and ep != tp * dp:
        raise UserError(f"{ROLLOUT}.expert_parallel_size={ep} with tensor_model_parallel_size={tp} and "
                        f"data_parallel_size={dp} is not accepted: accepted are 1 (experts tensor-split) and "
                        f"{tp * dp} (TP x DP: vLLM's expert parallelism), as verl asserts")
    if ep > 1 and not cfg.is_moe:
        raise UserError(f"{ROLLOUT}.expert_parallel_size={ep} needs a model with MoE layers; this one has none: "
                        "accepted is 1")
    heads, kv = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    if heads % tp:  # vllm/config/model.py, ModelConfig.verify_with_parallel_config
        raise UserError(f"{ROLLOUT}.tensor_model_parallel_size={tp} does not divide the model's {heads} attention "
                        f"heads (vLLM refuses it): accepted are {_divisors(heads)}")
    if kv % tp and tp % kv:  # vllm/model_executor/layers/linear.py, QKVParallelLinear: split, or replicate above kv
        raise UserError(f"{ROLLOUT}.tensor_model_parallel_size={tp} neither divides the model's {kv} KV heads nor is "
                        f"a multiple of them (vLLM splits or replicates whole KV heads): accepted are "
                        f"{_divisors(heads, lambda t: kv % t == 0 or t % kv == 0)}")
    if mode == SEPARATE:
        per_node, devices = int(r.get("n_gpus_per_node") or 0), int(r.get("nnodes") or 0) * int(r.get("n_gpus_per_node") or 0)
    else:
        per_node, devices = int(c.trainer.n_gpus_per_node), world
    replica = tp * dp  # one vLLM server's devices (verl/workers/rollout/replica.py: TP x DP x PP, PP 1 for vLLM)
    if per_node % replica and replica % per_node:
        raise UserError(f"rollout TP x DP = {tp} x {dp} = {replica} devices a replica on nodes of {per_node}: verl "
                        f"places a replica on one node or on whole nodes; accepted is a replica size dividing "
                        f"{per_node} or a multiple of it")
    if devices % replica:
        raise UserError(f"rollout TP x DP = {replica} devices a replica does not divide the rollout's {devices} "
                        f"devices (verl would leave {devices % replica} idle): accepted is a divisor of {devices}")
    if dp > 1 and per_node % tp:  # vllm_async_server.py: data_parallel_size_local = gpus_per_node // TP
        raise UserError(f"{ROLLOUT}.tensor_model_parallel_size={tp} with data_parallel_size={dp} on nodes of "
                        f"{per_node}: verl splits a node into DP ranks of TP devices; accepted is a TP dividing {per_node}")
    return {"rollout_tp": tp, "rollout_dp": dp, "rollout_ep": ep, "rollout_replicas": devices // replica}


def _divisors(n: int, keep=lambda t: True) -> str:
    return ", ".join(str(t) for t in range(1, n + 1) if n % t == 0 and keep(t))


# vLLM's CUDAGraphMode names (vllm/config/compilation.py); verl 0.9.1 sets FULL_AND_PIECEWISE unless
# engine_kwargs.vllm.compilation_config.cudagraph_mode says otherwise (vllm_async_server.py, launch_server)
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
VERL_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"


def check_rollout_graph(c, env=None) -> str:
    """Graph mode of the vLLM rollout (``enforce_eager=False``), before Ray: the cudagraph mode vLLM (and on an NPU
    vllm-ascend) runs, and, on an NPU, the environment it needs (docs/ASCEND.md, "Rollout graph mode"). Returns
    the mode for the dry run's JSON line ("eager" or the cudagraph mode).

    Read and found composing with graph mode (nothing refused): router replay R3 (vLLM 0.31's
    ``_verify_aux_output_compatibility`` has no cudagraph condition; ``RoutedExpertsCapturer`` writes into a
    device buffer allocated once, which a graph replays), partial rollout (verl's ``abort_all_requests`` pauses
    the engine between steps) and both asynchronous modes (sleep mode maps the freed memory back at the same
    addresses on wake-up, ``vllm/device_allocator/cumem.py``)."""
    import os

    env = os.environ if env is None else env
    r = c.actor_rollout_ref.rollout
    device = str(c.trainer.get("device") or "")
    if str(r.get("name")) != "vllm":
        return "eager" if r.get("enforce_eager") else "engine default"
    from mcore_dapo.devices import get_adapter

    rollout = get_adapter(device).rollout if device else None
    if rollout is not None:
        rollout.check_weight_format(ROLLOUT, env)
    if r.get("enforce_eager"):
        return "eager"
    compilation = (r.get("engine_kwargs") or {}).get("vllm", {}) or {}
    compilation = compilation.get("compilation_config") or {}
    if isinstance(compilation, str):
        import json

        try:
            compilation = json.loads(compilation)
        except ValueError:
            raise UserError(f"{ROLLOUT}.engine_kwargs.vllm.compilation_config={compilation} is not accepted: "
                            "accepted is a mapping (or its JSON)") from None
    mode = str(compilation.get("cudagraph_mode") or VERL_CUDAGRAPH_MODE)
    key = f"{ROLLOUT}.engine_kwargs.vllm.compilation_config.cudagraph_mode"
    if mode not in CUDAGRAPH_MODES:
        raise UserError(f"{key}={mode} is not accepted: accepted are vLLM's {', '.join(CUDAGRAPH_MODES)}")
    sizes = r.get("cudagraph_capture_sizes")
    if sizes is not None and (not sizes or any(not isinstance(s, int) or s < 1 for s in sizes)):
        raise UserError(f"{ROLLOUT}.cudagraph_capture_sizes={list(sizes)} is not accepted: accepted is null (vLLM's "
                        "sizes) or a list of positive batch sizes")
    if mode == "NONE":
        return "eager"
    return rollout.graph_mode(ROLLOUT, mode, env) if rollout is not None else mode


CORRECTION = "algorithm.rollout_correction"


def check_rollout_precision(c) -> dict:
    """The rollout's weight precision (``rollout.quantization``) and whether the old-log-prob pass runs
    (``algorithm.rollout_correction.bypass_mode``), before Ray (docs/VERL_PLUGIN.md, "Cheaper rollouts"); one line
    each for what verl 0.9.1 would reject inside its Ray actors, or silently not apply. Returns the dry run's
    ``rollout_dtype`` and ``old_log_prob``.

    - ``fp8``: verl's on-the-fly blockwise FP8 (verl/workers/rollout/vllm_rollout/vllm_async_server.py,
      ``_apply_quantization``; the sync's bf16 tensors quantized by verl/utils/vllm/vllm_quant_utils.py
      ``quant_weights`` before vLLM's loader): CUDA only, and with token-level importance sampling (verl's FP8
      document matches bf16 accuracy only with it), which bypass mode does not apply.
    - ``ascend``: vllm-ascend's ModelSlim checkpoints; verl 0.9.1 re-quantizes a sync on the fly only for FP8 and
      vllm-ascend's MX types (``quant_weights``), not INT8 W8A8: a sync would hand bf16 tensors to int8
      parameters (docs/ASCEND.md, "Quantized rollout").
    - bypass: verl 0.9.1's v1 trainer takes the rollout's log-probs as the old policy and then skips the whole
      rollout correction (verl/trainer/ppo/v1/trainer_base.py, ``_compute_old_log_prob`` and
      ``compute_rollout_correction_and_add_to_batch`` under ``not bypass_recomputing_logprobs``): an IS or RS
      setting beside it would be silently dropped; router replay R2 records its routes in that skipped pass
      (verl/utils/config.py refuses it)."""
    r = c.actor_rollout_ref.rollout
    device = str(c.trainer.get("device") or "")
    corr = c.algorithm.get("rollout_correction") or {}
    bypass = bool(corr.get("bypass_mode", False))
    quant = r.get("quantization")
    quant = None if quant in (None, "null", "None", "") else str(quant)
    offered = get_adapter(device).rollout.quantizations if device else ()
    accepted = "".join(f" or {q}" for q in offered)
    if quant == "fp8":
        if quant not in offered:
            raise UserError(f"{ROLLOUT}.quantization=fp8 on trainer.device={device or 'unset'} is not accepted: "
                            "verl's FP8 rollout runs on CUDA (H100 and newer); accepted here is null (bf16)")
        if bypass or str(corr.get("rollout_is")) != "token":
            raise UserError(f"{ROLLOUT}.quantization=fp8 needs token-level importance sampling against the FP8 "
                            f"rollout (verl's FP8 document): accepted is {CORRECTION}.rollout_is=token with "
                            f"bypass_mode=False (got rollout_is={corr.get('rollout_is')}, bypass_mode={bypass})")
    elif quant == "ascend":
        raise UserError(f"{ROLLOUT}.quantization=ascend is not accepted: verl 0.9.1 re-quantizes a weight sync on "
                        "the fly only for fp8 (CUDA) and vllm-ascend's MX types, not for the INT8 W8A8 rollout of "
                        "A2, whose int8 parameters would take the sync's bf16 tensors; accepted is null (bf16)"
                        + accepted)
    elif quant is not None:
        raise UserError(f"{ROLLOUT}.quantization={quant} is not accepted: accepted is null (bf16)" + accepted)
    if bypass:
        kept = [k for k in ("rollout_is", "rollout_rs") if corr.get(k) not in (None, "null", "None")]
        if kept:
            raise UserError(f"{CORRECTION}.bypass_mode=True with " + ", ".join(f"{k}={corr.get(k)}" for k in kept)
                            + ": verl 0.9.1's v1 trainer applies no rollout correction in bypass mode (the PPO ratio "
                            "against the rollout's log-probs is the correction); accepted with bypass are "
                            f"{CORRECTION}.rollout_is=null and rollout_rs=null, or bypass_mode=False")
        replay = str(c.actor_rollout_ref.actor.megatron.get("router_replay", {}).get("mode", "disabled"))
        if replay == "R2":
            raise UserError(f"{CORRECTION}.bypass_mode=True with router_replay.mode=R2 is not accepted: R2 records "
                            "its routes in the old-log-prob pass that bypass skips (verl refuses it); accepted are "
                            "R3 or disabled, or bypass_mode=False")
    return {"rollout_dtype": quant or "bf16", "old_log_prob": "rollout's (bypass)" if bypass else "recomputed"}


SEPARATE = "separate_async"


def check_async(c) -> str:
    """``trainer.v1.trainer_mode`` and what ``separate_async`` needs, before Ray starts (docs/VERL_PLUGIN.md,
    "Asynchronous modes"). verl asserts some of these only inside the Ray trainer
    (``trainer_separate_async.py``), the rest it ignores or warns about; each is one line here."""
    trainer = c.trainer
    mode = str(trainer.get("v1", {}).get("trainer_mode", "sync"))
    if mode not in TRAINER_MODES:
        raise UserError(f"trainer.v1.trainer_mode={mode} is not accepted: accepted are {', '.join(TRAINER_MODES)}")
    hybrid = bool(c.actor_rollout_ref.get("hybrid_engine", True))
    if mode != SEPARATE:
        if not hybrid:  # verl's sync and colocate_async trainers build colocated replicas whatever it says
            raise UserError(f"actor_rollout_ref.hybrid_engine=False with trainer.v1.trainer_mode={mode}: its rollout "
                            "shares the training devices (verl ignores the setting); accepted is hybrid_engine=True, "
                            "or trainer_mode=separate_async for a rollout pool of its own")
        return mode
    rollout, sep = c.actor_rollout_ref.rollout, trainer.v1.separate_async
    for key in ("nnodes", "n_gpus_per_node"):
        if int(rollout.get(key) or 0) < 1:
            raise UserError(f"actor_rollout_ref.rollout.{key}={rollout.get(key)} with trainer_mode=separate_async: "
                            "the rollout needs devices of its own; accepted is a positive number")
    step, batch = int(sep.parameter_sync_step), int(c.data.train_batch_size)
    mini = int(c.actor_rollout_ref.actor.ppo_mini_batch_size)
    if step < 1 or batch != step * mini:
        raise UserError(f"trainer.v1.separate_async.parameter_sync_step={step} with data.train_batch_size={batch} and "
                        f"ppo_mini_batch_size={mini}: separate_async trains one mini-batch per round, so accepted is "
                        f"train_batch_size = parameter_sync_step x ppo_mini_batch_size"
                        + (f" (parameter_sync_step={batch // mini})" if mini and batch % mini == 0 else ""))
    if hybrid:
        raise UserError("actor_rollout_ref.hybrid_engine=True with trainer_mode=separate_async: verl would also put "
                        "rollout replicas on the training devices (memory held, a second weight sync); accepted is "
                        "hybrid_engine=False")
    if bool(sep.get("hybrid_rollout", {}).get("enable_switch", False)):
        raise UserError("trainer.v1.separate_async.hybrid_rollout.enable_switch=True lends the training devices to "
                        "generation through replicas that hybrid_engine=False does not build (verl ignores it); "
                        "accepted is enable_switch=False")
    check_checkpoint_engine(c)
    return mode


def check_checkpoint_engine(c) -> None:
    """The weight transport to the rollout pool: the trainer device's (``RolloutSettings.checkpoint_engine``)."""
    device = c.trainer.get("device")
    ce = c.actor_rollout_ref.rollout.checkpoint_engine
    backend, module = str(ce.get("backend")), ce.get("custom_backend_module")
    if backend == "naive":
        raise UserError("actor_rollout_ref.rollout.checkpoint_engine.backend=naive with trainer_mode=separate_async: "
                        "naive hands weights to a rollout on the same devices; accepted is "
                        + (repr(get_adapter(str(device)).rollout.checkpoint_engine()[0]) if device else "the device's transport"))
    if not device:
        return
    adapter = get_adapter(str(device))
    want, want_module = adapter.rollout.checkpoint_engine()
    if backend != want:
        raise UserError(f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend} is not accepted on "
                        f"trainer.device={device}: accepted is {want} (the device's transport)")
    if want_module is not None and module != want_module:
        raise UserError(f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={module} with backend "
                        f"{backend} on {device}: accepted is {want_module} (it registers the backend)")


def _megatron_version() -> str | None:
    """megatron-core's installed version, read without importing Megatron (MindSpeed must come first on Ascend)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return None
