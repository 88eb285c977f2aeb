"""Patches of verl for this project's ``cpu`` platform (see patches/manifest.toml), one module each.
Importing this package registers the implementations and imports nothing of verl."""

from mcore_dapo.patching.verl_cpu import (  # noqa: F401
    offload_buffers,
    offload_host_params,
    process_group,
    shm_receiver,
    vllm_cpu_dist,
)
