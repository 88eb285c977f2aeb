"""Megatron torch_dist checkpoints of this rank's model chunks (written and read under any layout).

The decoder layers have one of two key layouts, as megatron-core's
``TransformerBlock.sharded_state_dict`` decides:

* ``stacked``: ``decoder.layers.<name>`` with the global layer as a leading axis; what Megatron
  writes for homogeneous layers (every layer MoE, as in Qwen3-30B-A3B, or every layer dense), so
  what the standard configurations (``moe_layer_freq=1``: Megatron-LM, verl, MindSpeed-LLM) load;
* ``per-layer``: ``decoder.layers.<global layer>.<name>``; what Megatron writes for layers that
  differ (a list ``moe_layer_freq``: dense and MoE layers mixed). Such checkpoints record
  ``non_homogeneous_layers`` in their content metadata, which Megatron-LM's loaders pass back to
  ``sharded_state_dict``.

A checkpoint is written in the layout the model's config gives. Reading takes the layout from the
checkpoint's keys and builds the sharded state dict in it, so per-layer checkpoints of homogeneous
models (written by earlier versions of this project) load too.
"""

from __future__ import annotations

import re

from mcore_dapo.errors import UserError

STACKED, PER_LAYER = "stacked", "per-layer"
PER_LAYER_METADATA = {"non_homogeneous_layers": True}
_PER_LAYER_KEY = re.compile(r"decoder\.layers\.(\d+)\.")
_STACKED_KEY = re.compile(r"decoder\.layers\.(?!\d+\.)")


def _chunk_names(chunks) -> list[str]:
    """Megatron-LM's (and verl's) names of the model chunks in a checkpoint's state dict."""
    return ["model"] if len(chunks) == 1 else [f"model{i}" for i in range(len(chunks))]


def sharded_state_dict(chunks, layout: str | None = None) -> dict:
    """The sharded state dict Megatron's ``dist_checkpointing`` saves and loads for these chunks.

    ``layout``: ``per-layer`` forces one key per layer; otherwise the layout the config gives
    (per layer anyway for a model that mixes dense and MoE layers).
    """
    return {name: c.sharded_state_dict(metadata=dict(PER_LAYER_METADATA) if layout == PER_LAYER else None)
            for name, c in zip(_chunk_names(chunks), chunks)}


def _entries(state: dict) -> list:
    """The ShardedTensors, factories and ShardedObjects of a sharded state dict, in model order."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase

    return [v for v in nested_values(state) if isinstance(v, ShardedBase)]


def key_layout(keys) -> str | None:
    """``stacked`` or ``per-layer`` for a collection of checkpoint keys; None when they mix both or
    have no decoder layer."""
    keys = list(keys)
    per_layer = any(_PER_LAYER_KEY.match(k) for k in keys)
    stacked = any(_STACKED_KEY.match(k) for k in keys)
    return {(True, False): PER_LAYER, (False, True): STACKED}.get((per_layer, stacked))


def _metadata(path) -> list:
    """The tensors and objects a torch_dist checkpoint's metadata lists (no data read)."""
    from megatron.core.dist_checkpointing import check_is_distributed_checkpoint
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    if not check_is_distributed_checkpoint(str(path)):
        raise UserError(f"{str(path)!r} is not a torch_dist checkpoint: it has no valid metadata.json")
    return list(load_sharded_metadata(str(path)).values())


def checkpoint_keys(path) -> dict[str, tuple]:
    """Key -> global shape of every tensor and object of a torch_dist checkpoint."""
    return {v.key: tuple(v.global_shape) for v in _metadata(path)}


def checkpoint_dtype(path) -> str:
    """``fp32``, ``bf16`` or ``fp16``: the dtype most of a torch_dist checkpoint's tensors have."""
    import collections

    import torch

    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    counts = collections.Counter(names.get(getattr(v, "dtype", None)) for v in _metadata(path))
    counts.pop(None, None)
    if not counts:
        raise UserError(f"torch_dist checkpoint {str(path)!r} has no fp32, bf16 or fp16 tensor")
    return counts.most_common(1)[0][0]


def layers_in(keys: dict[str, tuple], layout: str) -> int:
    """How many decoder layers checkpoint keys (with their global shapes) hold in ``layout``."""
    if layout == PER_LAYER:
        return 1 + max((int(m.group(1)) for m in map(_PER_LAYER_KEY.match, keys) if m), default=-1)
    return max((shape[0] for k, shape in keys.items() if _STACKED_KEY.match(k) and shape), default=0)


def _mismatch(entries: list, ckpt: dict[str, tuple], layout: str, num_layers: int) -> str | None:
    """What keeps a checkpoint from loading into these entries (None when nothing does)."""
    for e in entries:
        if e.key not in ckpt:
            return f"key {e.key!r} is missing"
        shape = getattr(e, "global_shape", None)  # factories (gated MLPs) have none
        if shape is not None and tuple(shape) != ckpt[e.key]:
            return f"key {e.key!r} has shape {list(ckpt[e.key])} in the checkpoint, {list(shape)} in the model"
    found = layers_in(ckpt, layout)
    if found != num_layers:
        return f"it holds {found} layers"
    return None


def _agreed(problem: str | None) -> str | None:
    """The first rank's problem, on every rank (ranks hold different layers and experts)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return problem
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p), None)


def save_dist_checkpoint(chunks, path) -> str:
    """Write the chunks as a torch_dist checkpoint in the key layout their config gives; returns it."""
    from megatron.core import dist_checkpointing

    from mcore_dapo.megatron_compat import accepts

    state = sharded_state_dict(chunks)
    layout = key_layout(e.key for e in _entries(state))
    # megatron-core 0.12.x records no content metadata (its save() has no such argument); the keys
    # themselves say per-layer, which is what this project's readers go by
    extra = {"content_metadata": dict(PER_LAYER_METADATA) if layout == PER_LAYER else None} \
        if accepts(dist_checkpointing.save, "content_metadata") else {}
    dist_checkpointing.save(state, str(path), **extra)
    return layout


def load_dist_checkpoint(chunks, path) -> str:
    """Load a torch_dist checkpoint (written under any layout, keys stacked or per layer) into this
    rank's model chunks; returns the key layout found.

    A checkpoint that does not fit the model (a key of the expected layout missing, a shape or
    a layer count that differs) is a one-line :class:`UserError`, on every rank, before any read.
    """
    from megatron.core import dist_checkpointing

    ckpt = checkpoint_keys(path)
    state = sharded_state_dict(chunks, key_layout(ckpt))
    entries = _entries(state)
    layout = key_layout(e.key for e in entries)
    num_layers = chunks[0].config.num_layers
    problem = _agreed(_mismatch(entries, ckpt, layout, num_layers))
    if problem:
        raise UserError(f"torch_dist checkpoint {str(path)!r} does not fit the model ({num_layers} layers, "
                        f"{layout} keys expected): {problem}")
    state = dist_checkpointing.load(state, str(path))  # also holds the content metadata, if any
    for name, c in zip(_chunk_names(chunks), chunks):
        c.load_state_dict(state[name], strict=True)
    return layout
