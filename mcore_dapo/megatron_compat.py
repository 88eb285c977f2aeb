"""The few Megatron call signatures that differ between megatron-core 0.12.1 and 0.16.1.

Decided by asking the installed Megatron (its signatures), not by its version number, so that the
releases in between work where they have either form. Imports Megatron lazily (MindSpeed first on
Ascend).

* The TP all-reduce of replicated gradients (norms under sequence parallelism, q/k norms): 0.16's
  ``finalize_model_grads._allreduce_non_tensor_model_parallel_grads``, 0.12.1's
  ``_allreduce_layernorm_grads`` (same arguments: model chunks, config).
* Virtual pipeline stages: 0.16 passes ``vp_stage`` to the block spec, ``GPTModel`` and
  ``is_pipeline_first/last_stage``; 0.12.1 has none of these arguments and reads the stage from
  ``parallel_state``'s virtual pipeline rank instead (``megatron/core/transformer/transformer_block.py``
  and ``megatron/core/models/gpt/gpt_layer_specs.py`` at core_v0.12.1).
"""

from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _parameters(fn) -> frozenset:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def accepts(fn, name: str) -> bool:
    """Whether ``fn`` (a function or a class's ``__init__``) takes an argument ``name``."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    return name in _parameters(target)


def stage_kwargs(fn, vp_stage: int | None, pp_rank: int | None = None) -> dict:
    """``vp_stage`` / ``pp_rank`` for ``fn``, only where it takes them."""
    kw = {}
    if accepts(fn, "vp_stage"):
        kw["vp_stage"] = vp_stage
    if pp_rank is not None and accepts(fn, "pp_rank"):
        kw["pp_rank"] = pp_rank
    return kw


def decoder_block_spec(config, *, use_transformer_engine: bool, vp_stage: int | None = None,
                       pp_rank: int | None = None):
    """``get_gpt_decoder_block_spec`` for the pipeline stage being built (see :func:`enter_stage`)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    return get_gpt_decoder_block_spec(config, use_transformer_engine=use_transformer_engine,
                                      normalization="RMSNorm",
                                      **stage_kwargs(get_gpt_decoder_block_spec, vp_stage, pp_rank))


def vp_stage_is_global() -> bool:
    """True where Megatron reads the virtual pipeline stage from parallel_state (0.12.x)."""
    from megatron.core.models.gpt import GPTModel

    return not accepts(GPTModel, "vp_stage")


def enter_stage(vp_stage: int | None) -> None:
    """Before a virtual pipeline stage's chunk is built: on 0.12.x, set parallel_state's virtual rank."""
    if vp_stage is not None and vp_stage_is_global():
        from megatron.core import parallel_state as ps

        ps.set_virtual_pipeline_model_parallel_rank(vp_stage)


def is_first_stage(vp_stage: int | None) -> bool:
    from megatron.core import parallel_state as ps

    return ps.is_pipeline_first_stage(ignore_virtual=False,
                                      **stage_kwargs(ps.is_pipeline_first_stage, vp_stage))


def is_last_stage(vp_stage: int | None) -> bool:
    from megatron.core import parallel_state as ps

    return ps.is_pipeline_last_stage(ignore_virtual=False,
                                     **stage_kwargs(ps.is_pipeline_last_stage, vp_stage))


def allreduce_tp_replicated_grads(chunks, config) -> None:
    """Megatron's TP all-reduce of the gradients of TP-replicated parameters (sequence-parallel and q/k
    norms), under the name the installed Megatron gives it."""
    import importlib

    # (the package megatron.core.distributed re-exports the function finalize_model_grads under the module's name)
    fmg = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    fn = getattr(fmg, "_allreduce_non_tensor_model_parallel_grads", None) or fmg._allreduce_layernorm_grads
    fn(chunks, config)


ROUTING_REPLAY_SINCE = "0.16.0"  # TransformerConfig.moe_enable_routing_replay first appears in core_v0.16.0


def supports_routing_replay() -> bool:
    """Whether the installed Megatron has MoE routing replay (``TransformerConfig.moe_enable_routing_replay``,
    ``megatron/core/transformer/transformer_config.py``; absent up to core_v0.15, present from core_v0.16.0)."""
    import dataclasses

    from megatron.core.transformer.transformer_config import TransformerConfig

    return "moe_enable_routing_replay" in {f.name for f in dataclasses.fields(TransformerConfig)}


def routing_replay_refusal(mode: str, installed: str) -> str:
    """The one line for router replay asked of a Megatron without it."""
    return (f"router_replay.mode={mode} needs MoE routing replay, which megatron-core {installed} does not have "
            f"(TransformerConfig.moe_enable_routing_replay, from megatron-core {ROUTING_REPLAY_SINCE}); accepted "
            f"with megatron-core {installed} is router_replay.mode=disabled")


def gated_fc1_stride(use_kitchen: bool = False) -> int:
    """The ``partition_stride`` Megatron itself gives a gated MLP's ``linear_fc1`` weight: 2 from core_v0.16.0
    (``MLP.__init__``'s ``fc1_stride`` in ``megatron/core/transformer/mlp.py``, 1 with ``use_kitchen``), 1 up to
    core_v0.15 (no stride passed)."""
    from packaging.version import Version

    from megatron.core.package_info import __version__

    return 2 if Version(__version__) >= Version("0.16.0") and not use_kitchen else 1
