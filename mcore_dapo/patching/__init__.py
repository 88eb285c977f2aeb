"""Patches of other packages: registry (manifest + implementations) and the implementations,
one module per patch (:mod:`.megatron_any`, :mod:`.megatron_cpu`, :mod:`.torch_cpu`, :mod:`.verl_any`, :mod:`.verl_cpu`,
:mod:`.vllm_cpu`)."""

from mcore_dapo.patching.registry import apply, applied_ids, load_manifest, remove_all, status

__all__ = ["apply", "applied_ids", "load_manifest", "remove_all", "status", "load_implementations"]


def load_implementations() -> None:
    """Import the modules that register implementations (cheap: they import nothing heavy)."""
    from mcore_dapo.patching import megatron_any, megatron_cpu, torch_cpu, verl_any, verl_cpu, vllm_cpu  # noqa: F401
