"""Patches that let real megatron-core run on the CPU under gloo (see patches/manifest.toml), one module each.

Kept narrow on purpose: Megatron's own modules see a *view* of torch whose ``cuda``
namespace maps to the CPU (:mod:`.torch_view`); every other package (transformers computing
the HF reference, in particular) keeps the real thing. The one exception touches a tensor
method, for the duration of two dist-checkpoint exchange functions only (:mod:`.dist_ckpt_exchange`).
Importing this package registers the implementations and imports nothing of Megatron.
"""

from mcore_dapo.patching.megatron_cpu import (  # noqa: F401
    alltoall_lists,
    clip_grads,
    dist_ckpt_exchange,
    distrib_optimizer,
    float16_optimizer,
    fp8_param_shard,
    rng_state,
    router_gemm,
    schedule_token_counter,
    tied_embedding_sync,
    torch_adam_state,
    torch_view,
    uneven_gather_scatter,
)
