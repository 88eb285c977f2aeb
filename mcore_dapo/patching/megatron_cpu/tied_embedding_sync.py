"""``cpu.megatron.tied-embedding-sync``: with tied embeddings and PP > 1, ``LanguageModule.
setup_embeddings_and_output_layer`` moves the shared weight to the GPU with ``Tensor.cuda()`` before
all-reducing it over the embedding group; while it runs, ``Tensor.cuda()`` returns the tensor itself."""

from __future__ import annotations

from mcore_dapo.patching.megatron_cpu.dist_ckpt_exchange import _on_cpu
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


@implements("cpu.megatron.tied-embedding-sync")
def _tied_embedding_sync(patch: Patcher) -> None:
    patch.wrap(_on_cpu, "megatron.core.models.common.language_module.language_module:"
                        "LanguageModule.setup_embeddings_and_output_layer")
