"""HF config -> Megatron-core ``TransformerConfig`` settings and ``GPTModel`` arguments.

The fields every model shares (sizes, layout, dtype, dispatcher, MoE sizes) are set here; the model's own
(normalization, biases, rotary embedding, activation) come from its spec (``bridge/models/<model>/megatron.py``).

Kept as plain dictionaries first (:func:`transformer_config_kwargs`,
:func:`gpt_model_kwargs`) so that the mapping can be read and tested without
importing Megatron; :func:`build_transformer_config` makes the real object.
Megatron is imported lazily: on Ascend, MindSpeed must be imported before it.
"""

from __future__ import annotations

from mcore_dapo.bridge.hf_config import HFModelConfig
from mcore_dapo.bridge.layout import Layout
from mcore_dapo.bridge.models import get_model
from mcore_dapo.errors import UserError

DISPATCHERS = ("alltoall", "allgather")
DTYPES = ("fp32", "bf16", "fp16")


def padded_vocab_size(vocab: int, tp: int, divisible_by: int | None = None) -> int:
    """Vocab size Megatron builds: a multiple of ``divisible_by * tp``.

    ``None`` picks the largest power of two up to 128 for which the real vocab
    needs no padding (Qwen3's 151936 = 128 * 1187 needs none up to TP4), so the
    logits of every real token are exactly those of the HF model. Padding rows
    (when any) are zero on load and dropped on export.
    """
    if divisible_by is None:
        divisible_by = 128
        while divisible_by > 1 and vocab % (divisible_by * tp):
            divisible_by //= 2
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


def moe_layer_pattern(cfg: HFModelConfig) -> int | list[int]:
    """Megatron's ``moe_layer_freq``: ``1`` when every layer is MoE, as standard configurations of the
    model (Megatron-LM, verl, MindSpeed-LLM) set it, so that torch_dist checkpoints stack the layers
    under one key; a per-layer list only for a model that mixes dense and MoE layers (Megatron then
    writes one key per layer)."""
    pattern = [1 if cfg.is_moe_layer(i) else 0 for i in range(cfg.num_layers)]
    return 1 if all(pattern) else pattern


def transformer_config_kwargs(
    cfg: HFModelConfig,
    layout: Layout,
    *,
    dtype: str = "bf16",
    dispatcher: str = "alltoall",
    grouped_gemm: bool = False,
    sequence_parallel: bool | None = None,
    aux_loss_coeff: float | None = None,
    recompute: str = "none",
) -> dict:
    """The ``TransformerConfig`` fields for this model and layout."""
    layout.validate(cfg)
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r} is not accepted: accepted are {', '.join(DTYPES)}")
    if dispatcher not in DISPATCHERS:
        raise UserError(f"dispatcher={dispatcher!r} is not accepted: accepted are {', '.join(DISPATCHERS)}")
    if recompute not in ("none", "full", "selective"):
        raise UserError(f"recompute={recompute!r} is not accepted: accepted are none, full, selective")
    spec = get_model(cfg)
    if sequence_parallel is None:
        # Megatron's MoE layer requires sequence parallelism whenever TP > 1 in training.
        sequence_parallel = layout.tp > 1
    kw = dict(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_key_value_heads,
        kv_channels=cfg.head_dim,
        ffn_hidden_size=cfg.intermediate_size,
        **spec.transformer_config(cfg),  # the model's own: normalization, biases, qk layernorm, router
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=float(cfg.raw.get("initializer_range", 0.02)),
        **layout.megatron_sizes(),
        sequence_parallel=bool(sequence_parallel and layout.tp > 1),
        params_dtype={"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype],
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        # Megatron's allgather dispatcher refuses variable sequence lengths (checked for dense models too)
        moe_token_dispatcher_type=dispatcher,
        variable_seq_lengths=dispatcher == "alltoall",
        # the interleaved schedule's point-to-point communication as Megatron's training arguments
        # (megatron/training/arguments.py) and verl's engine set it: unbatched and overlapped. Batched
        # (megatron-core's default), PP2 puts two sends and two receives between the same two ranks in one
        # batch, matched in posting order, so a received activation and gradient swap (wrong gradients, seen
        # with 4 micro-batches on PP2 x VPP2; Megatron's arguments refuse PP2 with VPP unless overlapped)
        **({"overlap_p2p_comm": True, "batch_p2p_comm": False} if layout.vpp else {}),
        # fused kernels are the device adapter's to turn on (FastPaths.paths; runtime.model.build_model
        # and the verl engine put them under the user's override_transformer_config)
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
    if cfg.is_moe:
        kw.update(
            num_moe_experts=cfg.num_experts,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_ffn_hidden_size=cfg.moe_intermediate_size,
            moe_router_load_balancing_type="aux_loss" if (aux_loss_coeff if aux_loss_coeff is not None else cfg.router_aux_loss_coef) > 0 else "none",
            moe_aux_loss_coeff=cfg.router_aux_loss_coef if aux_loss_coeff is None else aux_loss_coeff,
            moe_grouped_gemm=grouped_gemm,
            moe_layer_freq=moe_layer_pattern(cfg),
        )
    if recompute == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        kw.update(recompute_granularity="selective")
    return kw


def gpt_model_kwargs(cfg: HFModelConfig, layout: Layout, *, make_vocab_size_divisible_by: int | None = None) -> dict:
    """``GPTModel`` arguments other than config, spec and pipeline position."""
    return dict(
        vocab_size=padded_vocab_size(cfg.vocab_size, layout.tp, make_vocab_size_divisible_by),
        max_sequence_length=cfg.max_position_embeddings,
        **get_model(cfg).gpt_model(cfg),  # the model's own: position embedding
        share_embeddings_and_output_weights=cfg.tie_word_embeddings,
        parallel_output=True,
    )


def split_overrides(overrides: dict | None) -> tuple[dict, dict]:
    """(TransformerConfig fields, everything else) of a user's ``override_transformer_config``.

    The rest are device feature flags (MindSpeed's on Ascend), for ``DeviceAdapter.configure``.
    """
    import dataclasses

    from megatron.core.transformer import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    overrides = dict(overrides or {})
    return ({k: v for k, v in overrides.items() if k in fields},
            {k: v for k, v in overrides.items() if k not in fields})


FIRST, LAST = "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"


def _two_stage_split(kw: dict, layout: Layout) -> None:
    """At PP 2 the first stage's size decides the split: Megatron gives the rest to the other stage (its one
    "middle" stage). With both sizes set there is no middle stage, and Megatron divides by their count
    (``TransformerConfig.__post_init__`` in 0.12.1, ``get_transformer_layer_offset`` with VPP in 0.16.1): the
    last size is dropped when it is the rest, refused otherwise."""
    first, last = kw.get(FIRST), kw.get(LAST)
    if layout.pp != 2 or first is None or last is None:
        return
    if first + last != kw["num_layers"]:
        raise UserError(f"{FIRST}={first} and {LAST}={last} with pipeline_model_parallel_size=2 cover "
                        f"{first + last} of the {kw['num_layers']} layers: accepted are sizes that add up to them")
    kw.pop(LAST)


def build_transformer_config(cfg: HFModelConfig, layout: Layout, overrides: dict | None = None, **kwargs):
    """The TransformerConfig; ``overrides`` (TransformerConfig fields only) win over the mapping."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    kw = transformer_config_kwargs(cfg, layout, **kwargs)
    fields, unknown = split_overrides(overrides)
    if unknown:
        raise UserError(f"override_transformer_config keys {sorted(unknown)} are not TransformerConfig fields")
    kw.update(fields)
    if kw.get("moe_use_legacy_grouped_gemm"):
        raise UserError("moe_use_legacy_grouped_gemm=True builds Megatron's legacy GroupedMLP (weight1/weight2 "
                        "holding every local expert), which the bridge does not map: accepted is "
                        "moe_use_legacy_grouped_gemm=False (grouped GEMM runs as TEGroupedMLP)")
    _two_stage_split(kw, layout)
    if isinstance(kw["params_dtype"], str):
        kw["params_dtype"] = getattr(torch, kw["params_dtype"])
    kw["pipeline_dtype"] = kw["params_dtype"]
    kw["activation_func"] = getattr(F, get_model(cfg).activation)
    if kw.get("attention_backend") is not None:  # verl's spelling, and the device adapters' fast paths
        kw["attention_backend"] = attn_backend(kw["attention_backend"])
    return TransformerConfig(**kw)


def attn_backend(value, key: str = "attention_backend"):
    """Megatron's ``AttnBackend`` for a name (verl's spelling, a string such as ``flash``) or the enum itself;
    the one conversion of the project. An unknown name: one line naming ``key`` and the accepted names."""
    from megatron.core.transformer.enums import AttnBackend

    if not isinstance(value, str):
        return value
    if value not in AttnBackend.__members__:
        raise UserError(f"{key}={value!r} is not accepted: accepted are {', '.join(AttnBackend.__members__)}")
    return AttnBackend[value]
