"""The rollout engine beside the trainer on a device (vLLM, vllm-ascend, vLLM's CPU build): one
:class:`RolloutSettings` per adapter (``adapter.rollout``), subclassed per device in the device's file."""

from __future__ import annotations


class RolloutSettings:
    package: str = "vllm"  # the rollout engine's Python package on this device
    install: str = "pip install 'mcore-dapo[cuda]'"
    # ``rollout.quantization`` values whose weight syncs verl 0.9.1 re-quantizes on the fly for this device's engine
    # (verl/utils/vllm/vllm_quant_utils.py ``quant_weights``): none but on CUDA (docs/VERL_PLUGIN.md, "Cheaper rollouts")
    quantizations: tuple[str, ...] = ()

    def __init__(self, adapter):
        self.adapter = adapter

    @property
    def name(self) -> str:
        return self.adapter.name

    def ray_resources(self) -> tuple[dict, dict]:
        """(``ray.init`` arguments, the engine actor's options): one device for the actor (Ray sets
        CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES from it), no CPU reserved."""
        raise NotImplementedError(f"no rollout engine resources for {self.name}")

    def checkpoint_engine(self) -> tuple[str, str | None]:
        """(verl checkpoint engine backend, ``checkpoint_engine.custom_backend_module`` or None): the weight
        transport from the trainer to standalone rollout replicas (verl's ``separate_async``) on this device."""
        raise NotImplementedError(f"no checkpoint engine for {self.name}")

    def engine_settings(self, gpu_memory_utilization: float) -> tuple[dict, dict]:
        """(environment defaults, ``vllm.LLM`` keyword arguments) of the engine on this device: on a device,
        its share of the device's memory, the rest left to the Megatron model beside it."""
        return {}, {"gpu_memory_utilization": gpu_memory_utilization}

    def check_model(self, head_dim: int) -> None:
        """Raise a one-line UserError when this device's vLLM cannot run the model (nothing refused here)."""

    def check_weight_format(self, key: str, env) -> None:
        """Raise a one-line UserError when the engine's environment keeps weights in a format the trainer's weight
        sync does not write (nothing here)."""

    def graph_mode(self, key: str, mode: str, env) -> str:
        """The vLLM ``cudagraph_mode`` that runs of ``mode`` (a vLLM name, not NONE) on this device with
        ``enforce_eager=False``, or a one-line UserError where graph mode cannot run (``key``: the rollout's config
        key). vLLM on CUDA runs every mode as asked."""
        return mode

