"""verl's model and engine keys that its own Megatron engine reads outside ``override_transformer_config``,
honoured on this plugin's engine or refused in one line, never ignored.

* ``actor_rollout_ref.model.enable_gradient_checkpointing`` (verl's default True): Megatron's full recompute
  (``recompute_granularity=full``, ``uniform``, one layer a chunk), unless ``override_transformer_config``
  sets ``recompute_granularity``; then its recompute fields decide.
* ``actor_rollout_ref.model.override_config``: on the FSDP path these override the HF config. The dropouts
  reach the TransformerConfig: ``attention_dropout`` -> ``attention_dropout``; ``resid_pdrop`` and
  ``embd_pdrop`` -> ``hidden_dropout`` (Megatron has one dropout for the residual and the embedding, so they
  must agree). Any other key is refused.
* ``actor_rollout_ref.<role>.megatron.sequence_parallel`` (verl's default True; verl's ``McoreEngineConfig``
  turns it off at TP 1): as asked. Megatron's MoE layer refuses TP > 1 without it in training
  (``megatron/core/transformer/moe/moe_layer.py``), so an MoE model at TP > 1 with it off is refused.
* ``actor_rollout_ref.<role>.megatron.override_mcore_model_config``: verl 0.9.1 reads one key of it,
  ``moe_config.freeze_moe_router`` (``verl/utils/megatron_utils.py``, ``make_megatron_module``): the routers'
  weights are not trained. Honoured; any other key is refused.
"""

from __future__ import annotations

from mcore_dapo.errors import UserError

DROPOUTS = {"attention_dropout": "attention_dropout", "resid_pdrop": "hidden_dropout", "embd_pdrop": "hidden_dropout"}
MODEL_CONFIG_KEYS = ("moe_config.freeze_moe_router",)


def _plain(node) -> dict:
    if node is None:
        return {}
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(node):
            return OmegaConf.to_container(node, resolve=True) or {}
    except ImportError:  # pragma: no cover - verl brings omegaconf
        pass
    return dict(node)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dropout_fields(override_config, where: str = "actor_rollout_ref.model.override_config") -> dict:
    """TransformerConfig dropout fields from verl's HF ``override_config``; other keys refused in one line."""
    fields: dict = {}
    for key, value in _flat(_plain(override_config)).items():
        field = DROPOUTS.get(key)
        if field is None:
            raise UserError(f"{where}.{key} is not honoured on the Megatron path: accepted are "
                            f"{', '.join(DROPOUTS)} (other TransformerConfig fields go in "
                            "actor_rollout_ref.actor.megatron.override_transformer_config)")
        value = float(value)
        if field in fields and fields[field] != value:
            raise UserError(f"{where}: resid_pdrop and embd_pdrop differ ({fields[field]} and {value}); Megatron has "
                            "one hidden_dropout for the residual and the embedding: accepted are equal values")
        fields[field] = value
    return fields


def freeze_moe_router(override_mcore_model_config, where: str) -> bool:
    """``moe_config.freeze_moe_router`` of verl's ``override_mcore_model_config``; other keys refused."""
    flat = _flat(_plain(override_mcore_model_config))
    for key in flat:
        if key not in MODEL_CONFIG_KEYS:
            raise UserError(f"{where}.override_mcore_model_config.{key} is not honoured: accepted is "
                            f"{', '.join(MODEL_CONFIG_KEYS)} (the one key verl 0.9.1 reads)")
    return bool(flat.get("moe_config.freeze_moe_router", False))


def recompute(enable_gradient_checkpointing: bool, overrides) -> str:
    """``full`` when verl asks for gradient checkpointing and ``override_transformer_config`` sets no
    ``recompute_granularity`` (else its recompute fields decide, as the user wrote them); else ``none``."""
    # verl's megatron.yaml declares recompute_granularity null (and recompute_modules, which acts only with a
    # granularity): a granularity the user set decides
    if _plain(overrides).get("recompute_granularity") is not None:
        return "none"
    return "full" if enable_gradient_checkpointing else "none"


def sequence_parallel(asked: bool, tp: int, is_moe: bool, where: str) -> bool:
    """Sequence parallelism as asked (it only exists at TP > 1)."""
    if tp > 1 and is_moe and not asked:
        raise UserError(f"{where}.sequence_parallel=False with tensor_model_parallel_size={tp}: Megatron's MoE layer "
                        "trains at TP > 1 only with sequence parallelism; accepted is sequence_parallel=True")
    return bool(asked) and tp > 1


def check(c, cfg) -> None:
    """Pre-flight (before Ray): every key above, for the actor and the reference."""
    model = c.actor_rollout_ref.model
    dropout_fields(model.get("override_config"))
    for role in ("actor", "ref"):
        node = c.actor_rollout_ref.get(role)
        if node is None or "megatron" not in node:
            continue
        mc, where = node.megatron, f"actor_rollout_ref.{role}.megatron"
        freeze_moe_router(mc.get("override_mcore_model_config"), where)
        if role == "actor" and mc.get("param_offload") and not mc.get("use_distributed_optimizer", True):
            # verl's offload frees the DDP buffers' param_data, which Megatron allocates for the distributed
            # optimizer only (megatron/core/distributed/param_and_grad_buffer.py)
            raise UserError(f"{where}.param_offload=True with use_distributed_optimizer=False: verl's offload needs "
                            "the distributed optimizer's parameter buffers; accepted is use_distributed_optimizer=True "
                            "(verl's default) or param_offload=False")
        sequence_parallel(bool(mc.get("sequence_parallel", True)), int(mc.tensor_model_parallel_size), cfg.is_moe, where)
