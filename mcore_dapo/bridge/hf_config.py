"""Read a Hugging Face ``config.json`` into one normalised record, :class:`HFModelConfig`.

Each registered model reads its own config (``bridge/models/<model>/hf_config.py``: the spellings of
each transformers version, the refusals); :func:`parse_hf_config` picks it by ``model_type``. Everything
downstream reads :class:`HFModelConfig`, never the raw dictionary.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mcore_dapo.errors import UserError


@dataclass(frozen=True)
class HFModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: str
    # MoE (zero experts for dense Qwen3)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = field(default_factory=tuple)
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """HF's rule (Qwen3MoeDecoderLayer): sparse unless listed in mlp_only_layers."""
        return (
            self.is_moe
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        d["mlp_only_layers"] = list(self.mlp_only_layers)
        return d


def first(raw: dict, *names, default=None):
    """The first of ``names`` that ``raw`` holds (not None), else ``default``: a field spelled two ways."""
    for n in names:
        if n in raw and raw[n] is not None:
            return raw[n]
    return default


def config_path(path: str | Path) -> Path:
    """The config.json for a model directory or a config file path."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise UserError(f"no config.json at {str(path)!r}: pass a Hugging Face model folder or its config.json")
    return p


def parse_hf_config(raw: dict) -> HFModelConfig:
    """config.json (a dict) -> :class:`HFModelConfig`, read by the registered model of its ``model_type``
    (:mod:`mcore_dapo.bridge.models`)."""
    from mcore_dapo.bridge.models import model_types, specs

    model_type = raw.get("model_type")
    accepted = model_types()
    if model_type not in accepted:
        raise UserError(f"model_type={model_type!r} is not supported: accepted are {', '.join(accepted)}")
    spec = next(s for s in specs() if model_type in s.model_types)
    return spec.parse_config(raw)


def load_hf_config(path: str | Path) -> HFModelConfig:
    p = config_path(path)
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p} is not valid JSON: {e.msg} at line {e.lineno}") from None
    return parse_hf_config(raw)
