"""``vllm-cpu.expert-map``: vLLM's CPU MoE kernel under expert parallelism.

With ``enable_expert_parallel`` each vLLM rank holds ``experts / EP`` experts and the router still returns
global expert ids; vLLM's modular MoE kernel hands the experts class an ``expert_map`` (global id -> local
id, -1 where the expert lives on another rank). vLLM 0.31's ``CPUUnquantizedExperts.apply``
(vllm/model_executor/layers/fused_moe/experts/cpu_moe.py) accepts every parallel config
(``_supports_parallel_config`` returns True) but never passes ``expert_map`` to ``cpu_fused_moe``, which
indexes the local weights by the global ids: out of range on every EP rank but the first, a segfault in
csrc/cpu/cpu_fused_moe.cpp (``fused_moe_impl``, line 242 of the 0.31.0 build) at the first forward. With
this patch the ids are mapped to local ones first and a token's weight for an expert of another rank is
zeroed (its slot then points at local expert 0 with weight 0); the layer's existing all-reduce over the
tensor/expert-parallel group adds the ranks' partial sums, as for the GPU kernels.
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "vllm.model_executor.layers.fused_moe.experts.cpu_moe"


def local_routes(topk_weights, topk_ids, expert_map):
    """(weights, ids) with global ``topk_ids`` mapped through ``expert_map`` to this rank's experts: an expert
    of another rank keeps a valid local id (0) and gets weight 0."""
    local = expert_map[topk_ids.long()]
    elsewhere = local < 0
    return topk_weights.masked_fill(elsewhere, 0), local.clamp(min=0).to(topk_ids.dtype)


def _mapping(original):
    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, *args, **kwargs):
        if expert_map is not None:
            topk_weights, topk_ids = local_routes(topk_weights, topk_ids, expert_map)
            expert_map = None
        return original(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                        global_num_experts, expert_map, *args, **kwargs)

    return apply


@implements("vllm-cpu.expert-map")
def _expert_map(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(_mapping, f"{MODULE}:CPUUnquantizedExperts.apply")))
