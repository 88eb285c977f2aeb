#!/usr/bin/env bash
# Ray head node, as in the guide. Usage: bash configs/ray_start_master.sh [IFNAME]
set -euo pipefail
IFNAME=${1:-eth0}
export RAY_DEDUP_LOGS=0 HYDRA_FULL_ERROR=1
if python3 -c "import torch_npu" 2>/dev/null; then
    export TASK_QUEUE_ENABLE=1 CPU_AFFINITY_CONF=1 VLLM_USE_V1=1 HCCL_OP_EXPANSION_MODE="AIV"
    export VLLM_ASCEND_ENABLE_FLASHCOMM=1 HCCL_ASYNC_ERROR_HANDLING=0 HCCL_EXEC_TIMEOUT=3600 HCCL_CONNECT_TIMEOUT=3600
    export VLLM_ASCEND_ENABLE_NZ=0  # the rollout's weights stay ND for the weight sync (docs/ASCEND.md)
    export LD_LIBRARY_PATH=/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/driver:${LD_LIBRARY_PATH:-}
    export HCCL_SOCKET_IFNAME="${IFNAME}"
else
    export NCCL_SOCKET_IFNAME="${IFNAME}"
fi
export GLOO_SOCKET_IFNAME="${IFNAME}"
ulimit -n 32768
ray start --head --port 6166 --dashboard-host=0.0.0.0 --dashboard-port=8260 --block
