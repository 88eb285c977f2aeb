"""Build the sharded Megatron GPTModel for a bridge, and load HF weights into it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from mcore_dapo import megatron_compat as compat
from mcore_dapo.bridge import Bridge, Resolved
from mcore_dapo.bridge.megatron_config import build_transformer_config, gpt_model_kwargs
from mcore_dapo.bridge.names import ExpertPlacement, canonical_name, layer_map_of
from mcore_dapo.devices import DeviceAdapter
from mcore_dapo.errors import UserError
from mcore_dapo.runtime.parallel import ParallelInfo


def model_config(bridge: Bridge, adapter: DeviceAdapter, *, dtype: str = "bf16", dispatcher: str = "alltoall",
                 init_weights: bool = False, wrapped_in_ddp: bool = False, overrides: dict | None = None,
                 overrides_key: str = "attention_backend", **config_kw):
    """The TransformerConfig :func:`build_model` builds with, in one place: the bridge's mapping
    (:func:`build_transformer_config`, which takes ``config_kw``), the device's fast paths under the caller's
    ``overrides`` (TransformerConfig fields, which win: :func:`fast_path_overrides`), the kernel the device runs
    for the attention backend asked (``overrides_key`` names it in a refusal), and where the weights are created
    (on the host where the device has no memory of its own; uninitialised unless ``init_weights``, for weights
    loaded next or for counting them)."""
    fields = fast_path_overrides(bridge, adapter, overrides, dispatcher=dispatcher, wrapped_in_ddp=wrapped_in_ddp)
    fields = device_attention_backend(fields, adapter, overrides_key)
    tf = build_transformer_config(bridge.cfg, bridge.layout, fields, dtype=dtype, dispatcher=dispatcher, **config_kw)
    tf.use_cpu_initialization = not adapter.has_device_memory()
    tf.perform_initialization = init_weights
    return tf


def device_attention_backend(fields: dict, adapter: DeviceAdapter, key: str = "attention_backend") -> dict:
    """``fields`` with ``attention_backend`` (verl spells it as a string, default ``flash``; Megatron wants the enum)
    as the kernel the device runs for it (the local one on the CPU); an unknown name is one line naming ``key``."""
    from mcore_dapo.bridge.megatron_config import attn_backend

    fields = dict(fields)
    backend = adapter.fast.attention_backend(attn_backend(fields.get("attention_backend"), key))
    if backend is not None:
        fields["attention_backend"] = backend
    return fields


def build_model(bridge: Bridge, adapter: DeviceAdapter, *, config=None, init_weights: bool = False,
                make_vocab_size_divisible_by: int | None = None, **config_kw) -> tuple[list[torch.nn.Module], object]:
    """The model chunks this rank holds (one per virtual pipeline stage) and the TransformerConfig they are built
    with: ``config`` (:func:`model_config`'s, which the verl engine builds first), else :func:`model_config` of
    ``init_weights`` and ``config_kw`` (its ``overrides`` set, for instance, uneven first/last pipeline stages).
    Without ``init_weights`` the tensor-parallel attributes are set all the same (:func:`mark_tensor_parallel`)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    layout = bridge.layout
    tf = config if config is not None else model_config(bridge, adapter, init_weights=init_weights, **config_kw)
    kw = gpt_model_kwargs(bridge.cfg, layout, make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    chunks = []
    for vp in range(layout.vpp or 1):
        vp_stage = vp if layout.vpp else None
        compat.enter_stage(vp_stage)
        spec = adapter.layer_spec(tf, vp_stage=vp_stage, pp_rank=ps.get_pipeline_model_parallel_rank())
        model = GPTModel(
            config=tf,
            transformer_layer_spec=spec,
            pre_process=compat.is_first_stage(vp_stage),
            post_process=compat.is_last_stage(vp_stage),
            **compat.stage_kwargs(GPTModel, vp_stage),
            **kw,
        )
        if not tf.perform_initialization:
            mark_tensor_parallel(model)
        chunks.append(adapter.to_device(model))
    compat.enter_stage(0 if layout.vpp else None)
    return chunks, tf


_WARNED: set[str] = set()


def fast_path_overrides(bridge: Bridge, adapter: DeviceAdapter, overrides: dict | None, *,
                        dispatcher: str = "alltoall", wrapped_in_ddp: bool = False) -> dict:
    """The device's fast paths (``FastPaths.fields``) under ``overrides`` (which win), and the
    device's one warning line for what this machine's software loses (logged once per process).
    gradient_accumulation_fusion only for a model Megatron's DDP wraps: the fused weight gradient is
    accumulated into the ``main_grad`` buffers DDP allocates."""
    import logging

    overrides = dict(overrides or {})
    replay = bool(overrides.get("moe_enable_routing_replay"))
    kw = dict(dispatcher=dispatcher, replay=replay)
    fields = adapter.fast.fields(bridge.cfg, bridge.layout, **kw)
    if not wrapped_in_ddp:
        fields.pop("gradient_accumulation_fusion", None)
    warning = adapter.fast.warning(bridge.cfg, bridge.layout, **kw)
    if warning and warning not in _WARNED:
        _WARNED.add(warning)
        logging.getLogger("mcore_dapo").warning(warning)
    return {**fields, **overrides}


def mark_tensor_parallel(model: torch.nn.Module) -> int:
    """Set ``tensor_model_parallel`` / ``partition_dim`` / ``partition_stride`` on the weights of
    Megatron's own tensor-parallel layers that have none of them; returns how many were set.

    Megatron-core 0.16.1 sets these attributes inside ``_initialize_affine_weight_cpu`` and
    ``_initialize_affine_weight_gpu`` (``megatron/core/tensor_parallel/layers.py``; the grouped
    experts likewise in ``megatron/core/transformer/moe/experts.py``), which its layers call only
    when ``config.perform_initialization`` is true. A model built without initialisation (weights
    loaded afterwards, as here) then has TP-split weights that look replicated, and Megatron's
    gradient norm (``param_is_not_tensor_parallel_duplicate``) counts them on TP rank 0 only: under
    TP > 1 the reported norm is too small and gradient clipping acts on it. The values set are those
    of the initialising path: the stride of a gated MLP's ``linear_fc1`` is Megatron's own
    (``megatron_compat.gated_fc1_stride``: 2 from 0.16, 1 before), 1 elsewhere. Megatron-core 0.12.1
    sets the attributes in the same two functions."""
    from megatron.core.tensor_parallel.layers import (_MODEL_PARALLEL_ATTRIBUTE_DEFAULTS as TP_ATTRS,
                                                      ColumnParallelLinear,
                                                      RowParallelLinear, VocabParallelEmbedding,
                                                      set_tensor_model_parallel_attributes)
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.experts import GroupedMLP

    from mcore_dapo.megatron_compat import gated_fc1_stride

    split_dims = (  # which dimension of each weight the layer splits over its tensor-parallel group
        (VocabParallelEmbedding, {"weight": 0}),
        (ColumnParallelLinear, {"weight": 0, "bias": 0}),
        (RowParallelLinear, {"weight": 1}),
        (GroupedMLP, {"weight1": 1, "weight2": 0}),
    )
    strides = {}
    for module in model.modules():
        fc1 = getattr(module, "linear_fc1", None) if isinstance(module, MLP) else None
        if fc1 is not None and module.config.gated_linear_unit:
            strides[id(fc1)] = gated_fc1_stride(getattr(module.config, "use_kitchen", False))
    n = 0
    for module in model.modules():
        for cls, dims in split_dims:
            if not isinstance(module, cls):
                continue
            for attr, dim in dims.items():
                p = getattr(module, attr, None)
                if not isinstance(p, torch.nn.Parameter) or any(hasattr(p, k) for k in TP_ATTRS):
                    continue
                set_tensor_model_parallel_attributes(p, is_parallel=True, dim=dim, stride=strides.get(id(module), 1))
                n += 1
    return n


@dataclass(frozen=True)
class LocalParam:
    name: str  # local name in its chunk
    chunk: int
    param: torch.nn.Parameter
    resolved: Resolved


def local_params(chunks: list[torch.nn.Module], bridge: Bridge, info: ParallelInfo) -> Iterator[LocalParam]:
    """Every parameter this rank holds, with its canonical name and mapping."""
    cfg = bridge.cfg
    experts = (
        ExpertPlacement(info.ep_rank, cfg.num_experts // info.ep_size) if cfg.is_moe else None
    )
    for ci, chunk in enumerate(chunks):
        layers = layer_map_of(chunk)
        for name, p in chunk.named_parameters():
            canon = canonical_name(name, layers, experts)
            try:
                resolved = bridge.resolve(canon)
            except KeyError:
                raise RuntimeError(f"Megatron parameter {name} ({canon}) has no HF mapping") from None
            yield LocalParam(name, ci, p, resolved)


@torch.no_grad()
def load_hf_weights(chunks, bridge: Bridge, reader, info: ParallelInfo, progress=None, on_tensor=None) -> int:
    """Copy this rank's shard of every parameter from the HF checkpoint; returns the count loaded. The one load
    loop of the project (the engine's start, ``mcore-convert hf2mcore``, the checks): ``progress`` wraps the list
    of this rank's parameters (a progress bar); ``on_tensor(lp, group_rank, hf_tensors)`` follows each copy."""
    n = 0
    params = list(local_params(chunks, bridge, info))
    for lp in (progress(params) if progress is not None else params):
        m = lp.resolved.mapping
        rank, size = info.group_rank(m.group)
        hf = [reader.get(h) for h in lp.resolved.hf]
        shard = m.to_megatron(hf, rank, size, bridge.dims)
        if tuple(shard.shape) != tuple(lp.param.shape):
            raise UserError(
                f"shape mismatch for {lp.resolved.megatron}: the checkpoint gives {tuple(shard.shape)} "
                f"from {', '.join(lp.resolved.hf)}, the model built from config.json has {tuple(lp.param.shape)}"
            )
        lp.param.data.copy_(shard.to(dtype=lp.param.dtype, device=lp.param.device))
        if on_tensor is not None:
            on_tensor(lp, rank, hf)
        n += 1
    return n
