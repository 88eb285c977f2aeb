#!/usr/bin/env bash
# The CUDA path on one NVIDIA node, in a few minutes: what `mcore-dapo env` sees, then Megatron on CUDA
# (Transformer Engine spec when TE imports, the local spec otherwise) against HF transformers:
#   1. the tiny Qwen3-MoE, fp32, forward and a backward pass through Megatron's schedules;
#   2. Qwen3-30B-A3B at its real width (hidden 2048, 32 heads / 4 KV groups, 128 experts top-8, vocab
#      151936) truncated to LAYERS layers with seeded random weights, Megatron in bf16 against an fp32
#      HF reference computed on the CPU (no download: the weights are generated).
# Each step writes a JSON result into WORKDIR; the last line printed is a summary.
#
#   tools/cuda_check.sh WORKDIR [NPROC] [LAYERS]      (NPROC GPUs, EP = NPROC; default 1 and 2)
set -euo pipefail
W=${1:?usage: tools/cuda_check.sh WORKDIR [NPROC] [LAYERS]}
N=${2:-1}
LAYERS=${3:-2}
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$W"
run() { "$PY" -m torch.distributed.run --nproc-per-node "$N" -m mcore_dapo_checks.logits --device cuda "$@"; }

"$PY" -m mcore_dapo.cli.main env --json > "$W/env.json"

"$PY" -m mcore_dapo_checks.tiny model "$W/tiny"
"$PY" -m mcore_dapo_checks.tiny reference "$W/tiny" "$W/tiny-ref.pt"
run --hf-path "$W/tiny" --reference "$W/tiny-ref.pt" --ep "$N" --backward --out "$W/tiny.json"

t0=$(date +%s)
"$PY" -m mcore_dapo_checks.tiny model "$W/real-width" --like "$HERE/configs/models/qwen3-30b-a3b" --layers "$LAYERS"
"$PY" -m mcore_dapo_checks.tiny reference "$W/real-width" "$W/real-width-ref.pt" --seq 64
t1=$(date +%s)
run --hf-path "$W/real-width" --reference "$W/real-width-ref.pt" --ep "$N" --dtype bf16 --out "$W/real-width.json"
t2=$(date +%s)

"$PY" - "$W" "$((t1 - t0))" "$((t2 - t1))" <<'EOF'
import json, sys
w = sys.argv[1]
env = json.load(open(f"{w}/env.json"))
out = {"device": env.get("device"), "torch": env.get("versions", {}).get("torch"),
       "megatron-core": env.get("versions", {}).get("megatron-core"),
       "transformer-engine": env.get("versions", {}).get("transformer-engine"),
       "tiny_fp32": json.load(open(f"{w}/tiny.json")),
       "real_width_bf16": json.load(open(f"{w}/real-width.json")),
       "seconds_generate_and_reference_cpu": int(sys.argv[2]), "seconds_megatron_cuda": int(sys.argv[3])}
print(json.dumps(out))
EOF
