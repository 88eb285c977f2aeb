"""Patches of torch on the CPU (see patches/manifest.toml): what an older torch's gloo lacks, and pinned memory
without an accelerator; one module each."""

from mcore_dapo.patching.torch_cpu import gloo_average, pin_memory  # noqa: F401
