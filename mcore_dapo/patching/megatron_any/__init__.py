"""Patches of megatron-core needed on every device (see patches/manifest.toml), one module each."""

from mcore_dapo.patching.megatron_any import numpy_product  # noqa: F401
