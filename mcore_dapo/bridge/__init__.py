"""HF <-> Megatron-core bridge for Qwen3 and Qwen3-MoE (the one source of truth for the mapping)."""

from mcore_dapo.bridge.bridge import Bridge, Resolved
from mcore_dapo.bridge.hf_config import HFModelConfig, load_hf_config, parse_hf_config
from mcore_dapo.bridge.layout import Layout

__all__ = ["Bridge", "Resolved", "HFModelConfig", "Layout", "load_hf_config", "parse_hf_config"]
