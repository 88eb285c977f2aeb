"""Patches of verl for every device (see patches/manifest.toml), one module each. Importing this package registers
the implementations and imports nothing of verl."""

from mcore_dapo.patching.verl_any import rollout_storage_guard, separate_async_logger  # noqa: F401
