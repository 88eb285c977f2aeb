"""The models the bridge maps, one folder each (``qwen3/``), registered by HF architecture.

:func:`get_model` is the one answer to "which model is this": the architecture lists of the plugin's
checks and of the vLLM receiver, the HF config reader, the bridge's table, the Megatron settings, vLLM's
fused layout and the planner's per-rank shapes all come from the :class:`ModelSpec` it returns.
"""

from __future__ import annotations

from mcore_dapo.bridge.models.spec import ModelSpec, VllmLayout
from mcore_dapo.errors import UserError

_BY_ARCHITECTURE: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Register ``spec`` under each of its architectures (one spec per architecture)."""
    for arch in spec.architectures:
        if arch in _BY_ARCHITECTURE and _BY_ARCHITECTURE[arch] is not spec:
            raise ValueError(f"architecture {arch} is registered already (model {_BY_ARCHITECTURE[arch].name})")
    for arch in spec.architectures:
        _BY_ARCHITECTURE[arch] = spec
    return spec


def unregister(spec: ModelSpec) -> None:
    for arch in spec.architectures:
        if _BY_ARCHITECTURE.get(arch) is spec:
            del _BY_ARCHITECTURE[arch]


def architectures() -> tuple[str, ...]:
    """Every registered HF architecture, in registration order."""
    return tuple(_BY_ARCHITECTURE)


def specs() -> list[ModelSpec]:
    """Every registered model, once each, in registration order."""
    return list({id(s): s for s in _BY_ARCHITECTURE.values()}.values())


def model_types() -> tuple[str, ...]:
    """Every ``model_type`` a registered model reads, in registration order."""
    return tuple(t for s in specs() for t in s.model_types)


def get_model(model) -> ModelSpec:
    """The spec of ``model``: an HF architecture name, a config.json as a dict (its ``architectures``, else
    its ``model_type``) or an :class:`~mcore_dapo.bridge.hf_config.HFModelConfig` (its ``model_type``).
    One :class:`UserError` line naming the model and the supported architectures otherwise."""
    if isinstance(model, str):
        if model in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[model]
        what = f"architecture {model}"
    else:
        raw = model if isinstance(model, dict) else {"model_type": model.model_type}
        archs = list(raw.get("architectures") or [])
        for arch in archs:
            if arch in _BY_ARCHITECTURE:
                return _BY_ARCHITECTURE[arch]
        for spec in specs():
            if not archs and raw.get("model_type") in spec.model_types:
                return spec
        what = f"architecture {archs[0]}" if archs else f"model_type={raw.get('model_type')!r}"
    raise UserError(f"{what} is not supported by mcore_dapo: supported are {', '.join(architectures())}")


def padded_vocab_names() -> tuple[str, ...]:
    """The tensors whose rows vLLM pads past the vocabulary, of every registered model."""
    return tuple(dict.fromkeys(n for s in specs() for n in s.vllm.padded_vocab))


def stacked_expert_names() -> tuple[str, ...]:
    """Name endings of vLLM's stacked expert weights, of every registered model."""
    return tuple(dict.fromkeys(n for s in specs() for n in s.vllm.stacked))


from mcore_dapo.bridge.models import qwen3  # noqa: E402  (registers the built-in model)

__all__ = ["ModelSpec", "VllmLayout", "architectures", "get_model", "model_types", "padded_vocab_names", "qwen3",
           "register", "specs", "stacked_expert_names", "unregister"]
