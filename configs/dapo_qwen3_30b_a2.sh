#!/usr/bin/env bash
# DAPO, Qwen3-30B-A3B, Ascend A2: 4 nodes x 8 NPU, verl's Megatron engine through mcore_dapo.
# Start Ray first (configs/ray_start_master.sh, configs/ray_start_worker.sh), then on the master:
#   nohup bash configs/dapo_qwen3_30b_a2.sh > qwen3-30b-a3b.log 2>&1 &
# Check the config without Ray or NPUs:  DRY_RUN=1 bash configs/dapo_qwen3_30b_a2.sh
# (it also prints the software stack this recipe expects, docs/ASCEND.md, and what of it is missing here)
#
# Layout, from `mcore-dapo plan --model configs/models/qwen3-30b-a3b --nodes 4 --devices-per-node 8 --device a2`
# (best of 2914 legal layouts, 50 GiB of the A2's 64 GiB in the update):
#   TP1: the model has 4 KV groups, so TP may be 1, 2 or 4; attention is 10% of the active
#        parameters, and TP>1 adds two all-reduces per layer on HCCS for little memory saving.
#   EP8: 128 experts / 8 = 16 experts per NPU; EP divides 128 and stays inside one node (HCCS).
#   PP2 with VPP2, stages of 26 and 22 layers (the last stage also holds the 151936-row output layer):
#        halves the weights and optimizer state per NPU, which is what makes 32 NPUs of 64 GiB fit.
#   ETP1: experts are not tensor-split (768-wide expert ffn; ETP>1 only adds communication).
#   DP = 32 / (TP1 * PP2) = 16; expert DP = 32 / (EP8 * PP2) = 2.
#   Rollout TP2 DP1 EP1 as in the guide (GEN_TP, GEN_DP, GEN_EP): 2 of the 4 KV groups per NPU, 16 vLLM
#   replicas; in ACL graph mode (ENFORCE_EAGER=False, CUDAGRAPH_MODE=PIECEWISE; the guide ran eager, which
#   ENFORCE_EAGER=True restores) with Ascend's NZ weight format off (docs/ASCEND.md, "Rollout graph mode").
# Trainer mode, from the same `mcore-dapo plan` (its "trainer modes" lines, projected from the guide's logged
# step; docs/PLANNER.md):
#   colocate_async  277.8 s/step  281.6 tok/s/dev  +11.8%  (verl publishes +56.4% at a longer response tail)
#   separate_async  292.5 s/step  267.5 tok/s/dev   +6.2%  2 training + 2 rollout nodes, + sync 11 s
#   sync            310.6 s/step  251.9 tok/s/dev
# so ASYNC=colocate. ASYNC=separate trains on NNODES - ROLLOUT_NNODES = 2 nodes with the LAYOUT below (it fits
# there: 60.2 GiB; the planner's best on 2 nodes, TP2 PP1 EP8, is 3% faster) and sends the weights to the
# rollout nodes with verl's HCCL checkpoint engine, registered as "nccl" on Ascend. ASYNC=off: verl's
# synchronous trainer.
# Cheaper rollouts, from the same plan ("cheaper rollouts" lines; docs/VERL_PLUGIN.md, "Cheaper rollouts"):
#   ROLLOUT_CORRECTION=bypass (the old-log-prob pass skipped: the log's 16.4 s) colocate_async 277.8 -> 261.4 s/step;
#   off by default (decoupled). No FP8 on the A2; verl 0.9.1's quantization=ascend is refused (docs/ASCEND.md).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NNODES=${NNODES:-4}
DEVICE=npu
MODEL_PATH=${MODEL_PATH:-/data/weights_hf/Qwen3-30B-A3B}
CKPTS_DIR=${CKPTS_DIR:-/data/ckpt/Qwen3-30B-A3B}
TRAIN_FILE=${TRAIN_FILE:-/data/datasets/dapo-math-17k.parquet}
TEST_FILE=${TEST_FILE:-/data/datasets/aime-2024.parquet}
GEN_TP=${GEN_TP:-2}  # GEN_DP, GEN_EP: common.sh's defaults (1) unless set
INFER_MAX_TOKENS=$((1024 * 16))
ENFORCE_EAGER=${ENFORCE_EAGER:-False}
CUDAGRAPH_MODE=${CUDAGRAPH_MODE:-PIECEWISE}  # what vllm-ascend runs of verl's default (docs/ASCEND.md)
LOGGER='["console"]'  # the guide's trainer.logger for this device

ASYNC=${ASYNC:-colocate}
ROLLOUT_NNODES=${ROLLOUT_NNODES:-2}
ROLLOUT_GPUS_PER_NODE=8
CKPT_ENGINE=nccl  # the NPU adapter's checkpoint_engine() (mcore_dapo/devices/npu.py)

LAYOUT=()
for role in actor ref; do
    LAYOUT+=(
        actor_rollout_ref.${role}.megatron.tensor_model_parallel_size=1
        actor_rollout_ref.${role}.megatron.pipeline_model_parallel_size=2
        actor_rollout_ref.${role}.megatron.virtual_pipeline_model_parallel_size=2
        actor_rollout_ref.${role}.megatron.context_parallel_size=1
        actor_rollout_ref.${role}.megatron.expert_model_parallel_size=8
        actor_rollout_ref.${role}.megatron.expert_tensor_parallel_size=1
    )
done
# ref's override_transformer_config follows the actor's in verl's megatron_ref.yaml
LAYOUT+=(
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_first_pipeline_stage=26
    +actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=22
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1
)

# The guide's Ascend environment
export RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1 TASK_QUEUE_ENABLE=1 CPU_AFFINITY_CONF=1 VLLM_USE_V1=1
export HCCL_OP_EXPANSION_MODE="AIV" VLLM_ASCEND_ENABLE_FLASHCOMM=1 HCCL_ASYNC_ERROR_HANDLING=0
export HCCL_EXEC_TIMEOUT=3600 HCCL_CONNECT_TIMEOUT=3600
# the rollout's weights stay in ND format: vLLM reloads them every step (docs/ASCEND.md, "Rollout graph mode");
# TASK_QUEUE_ENABLE=1 above is the guide's value for graph mode
export VLLM_ASCEND_ENABLE_NZ=${VLLM_ASCEND_ENABLE_NZ:-0}

source "${HERE}/dapo/common.sh"
run_dapo "$@"
