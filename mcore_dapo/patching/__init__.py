"""Patches of other packages: registry (manifest + implementations) and the implementations."""

from mcore_dapo.patching.registry import apply, applied_ids, load_manifest, remove_all, status

__all__ = ["apply", "applied_ids", "load_manifest", "remove_all", "status", "load_implementations"]


def load_implementations() -> None:
    """Import the modules that register implementations (cheap: they import nothing heavy)."""
    from mcore_dapo.patching import cpu_megatron  # noqa: F401
