#!/usr/bin/env bash
# DAPO, Qwen3-30B-A3B, NVIDIA H100: 4 nodes x 8 GPU, verl's Megatron engine through mcore_dapo.
# Start Ray first (configs/ray_start_master.sh, configs/ray_start_worker.sh GPU), then on the master:
#   nohup bash configs/dapo_qwen3_30b_h100.sh > qwen3-30b-a3b.log 2>&1 &
# Check the config without Ray or GPUs:  DRY_RUN=1 bash configs/dapo_qwen3_30b_h100.sh
#
# Layout, from `mcore-dapo plan --model configs/models/qwen3-30b-a3b --nodes 4 --devices-per-node 8 --device h100`
# (best of 2914 legal layouts, 51 GiB of 80 GiB in the update):
#   TP2: divides the 4 KV groups (TP <= 4); TP2 inside NVLink halves attention/embedding memory.
#   EP8: 128 experts / 8 = 16 experts per GPU, all-to-all inside one NVLink node.
#   PP1: no pipeline bubble; the weights fit without it on 80 GiB.
#   ETP1: experts whole on their GPU (the layout NeMo-RL and verl users report for this model).
#   DP = 32 / TP2 = 16; expert DP = 32 / EP8 = 4.
#   Rollout TP2 DP1 EP1 as in the guide (GEN_TP, GEN_DP, GEN_EP), with CUDA graphs (ENFORCE_EAGER=False, the
#   guide's) captured for the batch one replica sees (docs/VERL_PLUGIN.md, "Rollout layout and graph mode").
# Trainer mode, from the same `mcore-dapo plan` (its "trainer modes" lines, projected from the guide's logged
# step; docs/PLANNER.md):
#   colocate_async  277.8 s/step  281.6 tok/s/dev  +11.8%  (verl publishes +56.4% at a longer response tail)
#   separate_async  284.4 s/step  275.1 tok/s/dev   +9.2%  2 training + 2 rollout nodes, + sync 7 s
#   sync            310.6 s/step  251.9 tok/s/dev
# so ASYNC=colocate. ASYNC=separate trains on NNODES - ROLLOUT_NNODES = 2 nodes with the LAYOUT below (it fits
# there: 61.5 GiB; the planner's best on 2 nodes, TP2 PP2 EP2 VPP2, is 5% faster) and sends the weights to the
# rollout nodes with verl's nccl checkpoint engine (needs cupy). ASYNC=off: verl's synchronous trainer.
# Cheaper rollouts, from the same plan ("cheaper rollouts" lines; docs/VERL_PLUGIN.md, "Cheaper rollouts"):
#   ROLLOUT_CORRECTION=bypass (the old-log-prob pass skipped: the log's 16.4 s) colocate_async 277.8 -> 261.4 s/step;
#   ROLLOUT_DTYPE=fp8 (verl's published > 35 % faster rollout, not measured here) 277.8 -> 249.5 s/step. Not both:
#   FP8 needs the decoupled correction's token-level importance sampling. Both off by default (bf16, decoupled).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

NNODES=${NNODES:-4}
DEVICE=cuda
MODEL_PATH=${MODEL_PATH:-/data/weights_hf/Qwen3-30B-A3B}
CKPTS_DIR=${CKPTS_DIR:-/data/ckpt/Qwen3-30B-A3B}
TRAIN_FILE=${TRAIN_FILE:-/data/datasets/dapo-math-17k.parquet}
TEST_FILE=${TEST_FILE:-/data/datasets/aime-2024.parquet}
GEN_TP=${GEN_TP:-2}  # GEN_DP, GEN_EP: common.sh's defaults (1) unless set
INFER_MAX_TOKENS=$((1024 * 32))
ENFORCE_EAGER=${ENFORCE_EAGER:-False}
LOGGER='["tensorboard", "console"]'  # the guide's trainer.logger for this device

ASYNC=${ASYNC:-colocate}
ROLLOUT_NNODES=${ROLLOUT_NNODES:-2}
ROLLOUT_GPUS_PER_NODE=8
CKPT_ENGINE=nccl  # the CUDA adapter's checkpoint_engine() (mcore_dapo/devices/cuda.py)

LAYOUT=()
for role in actor ref; do
    LAYOUT+=(
        actor_rollout_ref.${role}.megatron.tensor_model_parallel_size=2
        actor_rollout_ref.${role}.megatron.pipeline_model_parallel_size=1
        actor_rollout_ref.${role}.megatron.virtual_pipeline_model_parallel_size=null
        actor_rollout_ref.${role}.megatron.context_parallel_size=1
        actor_rollout_ref.${role}.megatron.expert_model_parallel_size=8
        actor_rollout_ref.${role}.megatron.expert_tensor_parallel_size=1
    )
done
LAYOUT+=(
    actor_rollout_ref.actor.megatron.sequence_parallel=True
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1
)

export RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1 VLLM_USE_V1=1

source "${HERE}/dapo/common.sh"
run_dapo "$@"
