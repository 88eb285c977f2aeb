"""What the bridge knows of one model: :class:`ModelSpec`, the record a model's folder registers.

Everything model-specific is here or in the model's folder (``bridge/models/<model>/``): its HF
architectures and ``model_type`` values, the reading of its ``config.json``, its mapping table and the
size symbols of the table's HF shapes, its Megatron settings, and the layout vLLM holds its weights in.
Everything that serves every model (the mapping kinds, the layout, the generic TransformerConfig fields,
the planner's per-rank counts, which are read off the table) asks the spec and names no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class VllmLayout:
    """How vLLM's model of this architecture holds the hub tensors (TP1): ``fuse(hf, cfg, prefix)`` arranges
    them so (``cfg``: config.json as a dict; ``prefix``: where vLLM keeps the stacked experts under
    ``...mlp.``, read from the engine's names); ``padded_vocab``: the tensors whose rows vLLM pads past the
    vocabulary (compared over the real rows); ``stacked``: name endings of the stacked expert weights;
    ``expert_prefix(engine_names)``: ``prefix`` as the engine's own parameter names show it."""

    fuse: Callable
    padded_vocab: tuple[str, ...] = ()
    stacked: tuple[str, ...] = ()
    expert_prefix: Callable = lambda engine_names: "experts."  # the ``prefix`` of fuse, from the engine's names


@dataclass(frozen=True)
class ModelSpec:
    """One model family, registered under each of its HF architectures (:func:`mcore_dapo.bridge.models.register`).

    * ``parse_config(raw)``: config.json (a dict) -> :class:`~mcore_dapo.bridge.hf_config.HFModelConfig`,
      one-line refusals of what the mapping does not cover;
    * ``table(tie_word_embeddings)``: (mappings, copies), the canonical Megatron name <- HF names table
      (:mod:`mcore_dapo.bridge.mapping`); the first mapping outside the layers sits on the first pipeline
      stage, the others on the last; ``copies``: Megatron names that are copies of another mapped tensor;
    * ``hf_sizes(cfg)``: the values of the size symbols the table's HF shapes are written in;
    * ``hub_slices(name, shape)``: the hub tensors an HF model's in-memory tensor holds (fused experts);
    * ``transformer_config(cfg)``: the model's own TransformerConfig fields (normalization, biases, ...);
      the generic ones (sizes, layout, dtype, dispatcher) are :mod:`mcore_dapo.bridge.megatron_config`'s;
    * ``gpt_model(cfg)``: the model's own GPTModel arguments (position embedding);
    * ``activation``: the name of the MLP's activation in ``torch.nn.functional``;
    * ``vllm``: :class:`VllmLayout`;
    * ``hf_router``: the name ending of an MoE layer's router module in the HF model (its top-k gate).
    """

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    parse_config: Callable
    table: Callable
    hf_sizes: Callable
    hub_slices: Callable
    transformer_config: Callable
    gpt_model: Callable
    activation: str
    vllm: VllmLayout
    hf_router: str = "mlp.gate"
