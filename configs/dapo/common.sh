# The guide's DAPO settings for Qwen3-30B-A3B, spelled for verl 0.9.1, on the Megatron path.
# Sourced by configs/dapo_qwen3_30b_*.sh after they set: NNODES, DEVICE, MODEL_PATH, CKPTS_DIR,
# TRAIN_FILE, TEST_FILE, GEN_TP, INFER_MAX_TOKENS, ENFORCE_EAGER, LOGGER (trainer.logger, the guide's per
# device: verl's default ["console","wandb"] needs a wandb login) and the LAYOUT array (actor = ref);
# optional: GEN_DP, GEN_EP (default 1), CUDAGRAPH_MODE (vLLM's cudagraph_mode; unset: verl's default).
# Differences from the guide's FSDP script (see docs/VERL_PLUGIN.md):
#   recipe.dapo.main_dapo -> python -m mcore_dapo.verl_plugin.main_dapo (verl 0.9.1 has no recipe/ folder)
#   actor.strategy=fsdp + fsdp_config.*  -> actor.strategy=megatron + actor/ref .megatron.* (LAYOUT)
#   reward_model.reward_manager/overlong_buffer -> reward.reward_manager.name, reward.reward_kwargs.*
#   ulysses_sequence_parallel_size, use_torch_compile (FSDP only) -> dropped
#   +rollout.dp_model_parallel_size (gen_dp) -> rollout.data_parallel_size (GEN_DP);
#   +rollout.enable_expert_parallel -> rollout.expert_parallel_size (GEN_EP: TP x DP when on, else 1);
#   +rollout.rollout_world_size -> dropped (verl 0.9.1 derives the replicas from the devices)
#   data.gen_batch_size=96, filter_groups.max_num_gen_batches=10 -> filter_groups.max_inflight_gen_batches=3:
#       with filter groups on, verl 0.9.1's v1 trainer sets gen_batch_size to 1 and ignores
#       max_num_gen_batches (verl/trainer/ppo/v1/trainer_base.py); at most 3 x train_batch_size = 96 prompts
#       are in flight while it refills filtered groups (docs/VERL_PLUGIN.md, "Dynamic sampling")

# ROUTER_REPLAY=off|R2|R3 (default off): MoE router replay in training (docs/VERL_PLUGIN.md, "Router replay").
#   R2: compute_log_prob records the training routers' top-k, the update replays them.
#   R3: the update and the log-prob pass replay the rollout's routing; the rollout returns it through
#       rollout.enable_rollout_routing_replay=True, which verl's vLLM server turns into vLLM's
#       enable_return_routed_experts (vLLM >= 0.22.0; verl refuses older ones). vLLM 0.31's check
#       (vllm/config/vllm.py, _verify_aux_output_compatibility) wants Model Runner V2, prefix caching
#       (verl's default) and no rollout pipeline parallelism: VLLM_USE_V2_MODEL_RUNNER=1 is exported.
case "${ROUTER_REPLAY:-off}" in
    off) REPLAY_ARGS=() ;;
    R2) REPLAY_ARGS=(actor_rollout_ref.actor.megatron.router_replay.mode=R2) ;;
    R3) REPLAY_ARGS=(actor_rollout_ref.actor.megatron.router_replay.mode=R3
                     actor_rollout_ref.rollout.enable_rollout_routing_replay=True)
        export VLLM_USE_V2_MODEL_RUNNER=1 ;;
    *) echo "error: ROUTER_REPLAY=${ROUTER_REPLAY} is not accepted: accepted are off, R2, R3" >&2; exit 2 ;;
esac

# Checkpoints (docs/VERL_PLUGIN.md, "Checkpoints"): saved in the background (checkpoint.async_save=True):
#   training waits for the copy to host memory; each rank writes its own shards (optimizer state in
#   megatron-core's format with no gather, the HF weights it holds); the run's last save is in the format
#   another layout loads (megatron.dist_ckpt_optim_fully_reshardable=True: every save in it).
# ASYNC=off|colocate|separate (common.sh's default off; each device script sets its own from the planner):
# verl 0.9.1's v1 trainer modes (docs/VERL_PLUGIN.md, "Asynchronous modes").
#   colocate: trainer_mode=colocate_async, one batch generated ahead; partial rollout hides the long tail.
#   separate: trainer_mode=separate_async, a rollout pool of its own: ROLLOUT_NNODES of the NNODES nodes
#       (ROLLOUT_GPUS_PER_NODE each), the rest train; weights travel by the device's checkpoint engine
#       (CKPT_ENGINE, and CKPT_ENGINE_MODULE where the project registers it); parameter_sync_step=1, since
#       ppo_mini_batch_size = train_batch_size below and verl asserts train_batch_size = step x mini-batch.
#   both: a prompt group trained more than 4 model versions after it was submitted is dropped and refilled;
#       rollout correction (below) defaults to decoupled.
OFF_POLICY_ARGS=(
    trainer.v1.sampler.max_off_policy_threshold=4
    trainer.v1.sampler.max_off_policy_strategy=drop
)

# ROLLOUT_DTYPE=bf16|fp8 (default bf16; docs/VERL_PLUGIN.md, "Cheaper rollouts"): fp8 is verl 0.9.1's on-the-fly
#   blockwise FP8 rollout (CUDA only: the dry run refuses it on Ascend), which needs decoupled correction.
# ROLLOUT_CORRECTION=off|decoupled|bypass (default decoupled with ASYNC=colocate|separate or ROLLOUT_DTYPE=fp8,
#   else off):
#   decoupled: verl's K3-RS + token-TIS preset; the old policy is recomputed (router replay R2 needs that pass).
#   bypass: the rollout's log-probs are the old policy and the old-log-prob pass is skipped (16.4 s of the
#       guide's 310.6 s step); verl 0.9.1's v1 trainer then applies no IS or RS (the PPO ratio against the
#       rollout's log-probs is the correction: verl's bypass_ppo_clip preset). Argued for with R3, where the
#       rollout's and the trainer's routes agree.
case "${ROLLOUT_DTYPE:-bf16}" in
    bf16) DTYPE_ARGS=() ;;
    fp8) DTYPE_ARGS=(actor_rollout_ref.rollout.quantization=fp8) ;;
    *) echo "error: ROLLOUT_DTYPE=${ROLLOUT_DTYPE} is not accepted: accepted are bf16, fp8" >&2; exit 2 ;;
esac
if [ "${ASYNC:-off}" != off ] || [ "${ROLLOUT_DTYPE:-bf16}" = fp8 ]; then
    default_correction=decoupled
else
    default_correction=off
fi
case "${ROLLOUT_CORRECTION:-${default_correction}}" in
    off) CORRECTION_ARGS=() ;;
    decoupled) CORRECTION_ARGS=(algorithm.rollout_correction.bypass_mode=False
                                algorithm.rollout_correction.rollout_is=token
                                algorithm.rollout_correction.rollout_is_threshold=2.0
                                algorithm.rollout_correction.rollout_rs=seq_mean_k3
                                algorithm.rollout_correction.rollout_rs_threshold=0.01) ;;
    bypass) CORRECTION_ARGS=(algorithm.rollout_correction.bypass_mode=True
                             algorithm.rollout_correction.rollout_is=null
                             algorithm.rollout_correction.rollout_rs=null) ;;
    *) echo "error: ROLLOUT_CORRECTION=${ROLLOUT_CORRECTION} is not accepted: accepted are off, decoupled, bypass" >&2
       exit 2 ;;
esac
TRAINER_NNODES=${NNODES}
case "${ASYNC:-off}" in
    off) ASYNC_ARGS=() ;;
    colocate) ASYNC_ARGS=(trainer.v1.trainer_mode=colocate_async
                          trainer.v1.colocate_async.num_warmup_batches=1
                          "${OFF_POLICY_ARGS[@]}") ;;
    separate)
        if ! [[ "${ROLLOUT_NNODES:-}" =~ ^[1-9][0-9]*$ ]] || [ "${ROLLOUT_NNODES}" -ge "${NNODES}" ]; then
            echo "error: ROLLOUT_NNODES=${ROLLOUT_NNODES:-} is not accepted with ASYNC=separate: accepted is" \
                 "1 to $((NNODES - 1)) of the NNODES=${NNODES} nodes" >&2; exit 2
        fi
        TRAINER_NNODES=$((NNODES - ROLLOUT_NNODES))
        ASYNC_ARGS=(trainer.v1.trainer_mode=separate_async
                    actor_rollout_ref.hybrid_engine=False
                    actor_rollout_ref.rollout.nnodes=${ROLLOUT_NNODES}
                    actor_rollout_ref.rollout.n_gpus_per_node=${ROLLOUT_GPUS_PER_NODE:-8}
                    actor_rollout_ref.rollout.checkpoint_engine.backend=${CKPT_ENGINE:?the device script sets CKPT_ENGINE}
                    trainer.v1.separate_async.parameter_sync_step=1
                    "${OFF_POLICY_ARGS[@]}")
        if [ -n "${CKPT_ENGINE_MODULE:-}" ]; then
            ASYNC_ARGS+=(actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=${CKPT_ENGINE_MODULE})
        fi ;;
    *) echo "error: ASYNC=${ASYNC} is not accepted: accepted are off, colocate, separate" >&2; exit 2 ;;
esac

max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 6))
train_prompt_bsz=32
offload=True
n_resp_per_prompt=16
max_inflight_gen_batches=3
max_num_seqs=1024

# Rollout layout and graph mode (docs/VERL_PLUGIN.md, "Rollout layout and graph mode").
#   GEN_TP x GEN_DP devices make one vLLM replica; GEN_EP=1 keeps the experts tensor-split over them,
#   GEN_EP=GEN_TP*GEN_DP makes vLLM's expert parallelism (verl 0.9.1 accepts no other value; the dry run
#   refuses it before Ray, with a layout verl or vLLM would refuse).
#   ENFORCE_EAGER=False: vLLM's graphs (CUDA graphs; ACL graphs on Ascend), captured for the decode
#   batches one engine sees: at most max_inflight_gen_batches x train_batch_size x n sequences in flight,
#   spread over (rollout devices / GEN_TP) engines (each DP rank schedules its own batch); a larger batch
#   runs without a graph. CUDAGRAPH_MODE, when set, is vLLM's compilation_config.cudagraph_mode.
GEN_DP=${GEN_DP:-1}
GEN_EP=${GEN_EP:-1}
for var in GEN_TP GEN_DP GEN_EP; do
    if ! [[ "${!var:-}" =~ ^[1-9][0-9]*$ ]]; then
        echo "error: ${var}=${!var:-} is not accepted: accepted is a positive integer" >&2; exit 2
    fi
done
if [ "${ASYNC:-off}" = separate ]; then
    rollout_devices=$((ROLLOUT_NNODES * ${ROLLOUT_GPUS_PER_NODE:-8}))
else
    rollout_devices=$((NNODES * 8))
fi
case "${ENFORCE_EAGER:-}" in
    True|true) GRAPH_ARGS=() ;;
    False|false)
        engines=$((rollout_devices / GEN_TP > 0 ? rollout_devices / GEN_TP : 1))
        in_flight=$(((max_inflight_gen_batches * train_prompt_bsz * n_resp_per_prompt + engines - 1) / engines))
        top=$(((in_flight + 7) / 8 * 8))
        top=$((top < max_num_seqs ? top : max_num_seqs))
        capture_sizes="1,2,4"
        for ((size = 8; size <= top; size += 8)); do capture_sizes+=",${size}"; done
        GRAPH_ARGS=("actor_rollout_ref.rollout.cudagraph_capture_sizes=[${capture_sizes}]")
        if [ -n "${CUDAGRAPH_MODE:-}" ]; then
            GRAPH_ARGS+=(+actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode=${CUDAGRAPH_MODE})
        fi ;;
    *) echo "error: ENFORCE_EAGER=${ENFORCE_EAGER:-} is not accepted: accepted are True (eager) and False (graph mode)" >&2
       exit 2 ;;
esac

DAPO_ARGS=(
    data.train_files="${TRAIN_FILE}"
    data.val_files="${TEST_FILE}"
    data.prompt_key=prompt
    data.truncation=left
    data.max_prompt_length=${max_prompt_length}
    data.max_response_length=${max_response_length}
    data.train_batch_size=${train_prompt_bsz}
    actor_rollout_ref.rollout.n=${n_resp_per_prompt}
    actor_rollout_ref.rollout.max_num_seqs=${max_num_seqs}
    actor_rollout_ref.rollout.max_num_batched_tokens=$((1024 * 32))
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    algorithm.kl_ctrl.kl_coef=0.0
    actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.kl_loss_coef=0.0
    actor_rollout_ref.actor.clip_ratio_low=0.2
    actor_rollout_ref.actor.clip_ratio_high=0.28
    actor_rollout_ref.actor.clip_ratio_c=10.0
    algorithm.filter_groups.enable=True
    algorithm.filter_groups.max_inflight_gen_batches=${max_inflight_gen_batches}
    algorithm.filter_groups.metric=acc
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.actor.use_dynamic_bsz=True
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$((1024 * 16))
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=${INFER_MAX_TOKENS}
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=${INFER_MAX_TOKENS}
    actor_rollout_ref.model.path="${MODEL_PATH}"
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.optim.lr_warmup_steps=10
    actor_rollout_ref.actor.optim.weight_decay=0.1
    actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler=True
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_bsz}
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.optim.clip_grad=1.0
    actor_rollout_ref.actor.loss_agg_mode=token-mean
    actor_rollout_ref.actor.strategy=megatron
    "${LAYOUT[@]}"
    "${REPLAY_ARGS[@]}"
    actor_rollout_ref.actor.megatron.param_offload=${offload}
    actor_rollout_ref.actor.megatron.optimizer_offload=${offload}
    actor_rollout_ref.ref.megatron.param_offload=${offload}
    actor_rollout_ref.actor.megatron.dtype=bfloat16
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.gpu_memory_utilization=0.90
    actor_rollout_ref.rollout.tensor_model_parallel_size=${GEN_TP}
    actor_rollout_ref.rollout.data_parallel_size=${GEN_DP}
    actor_rollout_ref.rollout.expert_parallel_size=${GEN_EP}
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    actor_rollout_ref.rollout.top_k=-1
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7
    actor_rollout_ref.rollout.val_kwargs.top_k=-1
    actor_rollout_ref.rollout.val_kwargs.do_sample=True
    actor_rollout_ref.rollout.val_kwargs.n=1
    actor_rollout_ref.rollout.enforce_eager=${ENFORCE_EAGER}
    "${GRAPH_ARGS[@]}"
    "${DTYPE_ARGS[@]}"
    actor_rollout_ref.rollout.free_cache_engine=True
    reward.reward_manager.name=dapo
    +reward.reward_kwargs.max_resp_len=${max_response_length}
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True
    +reward.reward_kwargs.overlong_buffer_cfg.len=$((1024 * 4))
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
    +reward.reward_kwargs.overlong_buffer_cfg.log=False
    trainer.logger="${LOGGER}"
    trainer.project_name=DAPO
    trainer.experiment_name=DAPO-Qwen3-30B-megatron
    trainer.n_gpus_per_node=8
    trainer.nnodes=${TRAINER_NNODES}
    trainer.device=${DEVICE}
    trainer.val_before_train=False
    trainer.test_freq=200
    trainer.save_freq=50
    actor_rollout_ref.actor.checkpoint.async_save=True
    trainer.total_epochs=100
    trainer.default_local_dir="${CKPTS_DIR}"
    trainer.resume_mode=auto
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
    ++actor_rollout_ref.nccl_timeout=7200
    "${ASYNC_ARGS[@]}"
    "${CORRECTION_ARGS[@]}"
)

# DRY_RUN=1: compose and check the config only (no Ray, no device); the model's config.json comes
# from MODEL_PATH when present, else from the project's copy in configs/models/qwen3-30b-a3b.
# PRINT_ARGS=1: print the overrides, one a line, and run nothing (`mcore-dapo migrate` reads them).
run_dapo() {
    local here
    if [ -n "${PRINT_ARGS:-}" ]; then
        printf '%s\n' "${DAPO_ARGS[@]}" "$@"
        return 0
    fi
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [ ! -f "${MODEL_PATH}/config.json" ]; then
        export MCORE_DAPO_MODEL_CONFIG="${MCORE_DAPO_MODEL_CONFIG:-${here}/models/qwen3-30b-a3b}"
    fi
    python3 -m mcore_dapo.verl_plugin.main_dapo "${DAPO_ARGS[@]}" "$@"
}
