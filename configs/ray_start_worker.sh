#!/usr/bin/env bash
# Ray worker node, as in the guide. Usage: bash configs/ray_start_worker.sh MASTER_IP [IFNAME]
set -euo pipefail
MASTER_IP=${1:?usage: ray_start_worker.sh MASTER_IP [IFNAME]}
IFNAME=${2:-eth0}
export RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1
export GLOO_SOCKET_IFNAME="${IFNAME}"
ulimit -n 32768
if python3 -c "import torch_npu" 2>/dev/null; then
    export TASK_QUEUE_ENABLE=1 CPU_AFFINITY_CONF=1 VLLM_USE_V1=1 HCCL_OP_EXPANSION_MODE="AIV"
    export VLLM_ASCEND_ENABLE_FLASHCOMM=1 HCCL_ASYNC_ERROR_HANDLING=0 HCCL_EXEC_TIMEOUT=3600 HCCL_CONNECT_TIMEOUT=3600
    export VLLM_ASCEND_ENABLE_NZ=0  # the rollout's weights stay ND for the weight sync (docs/ASCEND.md)
    export LD_LIBRARY_PATH=/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/driver:${LD_LIBRARY_PATH:-}
    export HCCL_SOCKET_IFNAME="${IFNAME}"
    ray start --address="${MASTER_IP}:6166" --resources='{"NPU": 8}' --block
else
    export NCCL_SOCKET_IFNAME="${IFNAME}"
    ray start --address="${MASTER_IP}:6166" --block
fi
