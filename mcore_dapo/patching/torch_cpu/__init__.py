"""Patches for what an older torch's gloo lacks (see patches/manifest.toml), one module each."""

from mcore_dapo.patching.torch_cpu import gloo_average  # noqa: F401
