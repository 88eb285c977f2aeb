"""The device adapter interface: everything that differs between CUDA, Ascend and the CPU."""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod

from mcore_dapo.patching import registry


class DeviceAdapter(ABC):
    """One per device kind. Order of use:

    1. :meth:`prepare` before Megatron is imported (MindSpeed must come first on Ascend);
    2. :meth:`apply_patches` once Megatron is importable;
    3. :meth:`configure` with feature flags, before ``initialize_model_parallel``;
    4. :meth:`init_distributed`, then Megatron's parallel state, then :meth:`mark_model_parallel_initialised`;
    5. :meth:`layer_spec` when the model is built, :meth:`to_device` once it is.

    The other methods answer what callers would otherwise branch on the device's name for.
    """

    name: str = ""
    backend: str = ""
    rollout_package: str = "vllm"  # the rollout engine's Python package on this device
    rollout_install: str = "pip install 'mcore-dapo[cuda]'"

    @classmethod
    @abstractmethod
    def detect(cls) -> bool:
        """True when this machine has this kind of device."""

    def prepare(self) -> None:
        """Work that must happen before Megatron is imported."""

    def apply_patches(self) -> list[registry.PatchStatus]:
        """The installed torch and megatron-core checked against the supported ranges (one line when
        outside), then every manifest patch for this device that applies to them."""
        from mcore_dapo import versions
        from mcore_dapo.patching import load_implementations

        versions.check_stack()
        load_implementations()
        return registry.apply(self.name)

    def patch_status(self) -> list[registry.PatchStatus]:
        from mcore_dapo.patching import load_implementations

        load_implementations()
        return registry.status(self.name)

    def takes_feature_flags(self) -> bool:
        """Whether :meth:`configure` accepts feature flags (settings that are no TransformerConfig field)."""
        return False

    def feature_flags(self, overrides: dict | None, context_parallel_size: int) -> dict:
        """The feature flags a training engine's TransformerConfig ``overrides`` stand for (none here)."""
        return {}

    def configure(self, flags: dict | None = None) -> None:
        """Apply feature flags (MindSpeed's on Ascend). Must run before initialize_model_parallel."""
        if flags:
            raise ValueError(f"device {self.name!r} takes no feature flags, got {sorted(flags)}")

    def mark_model_parallel_initialised(self) -> None:
        """Called once Megatron's parallel state exists (feature flags come too late after it)."""

    @abstractmethod
    def device(self, local_rank: int):
        """The torch.device this process computes on."""

    def local_device(self):
        """The torch.device of this process (torchrun's LOCAL_RANK)."""
        return self.device(local_rank())

    def set_device(self, local_rank: int) -> None:
        pass

    def has_device_memory(self) -> bool:
        """Whether the device has memory apart from the host's. Only then do models move to it after
        being built (Megatron initialises them on the device itself), and do offloading to the host
        and loading back mean anything."""
        return True

    def to_device(self, module):
        """A model built by Megatron, on this process's device."""
        return module.to(self.local_device()) if self.has_device_memory() else module

    def _torch_module(self):
        """``torch.cuda`` / ``torch.npu``: None where the device has no memory of its own or is absent."""
        import torch

        return getattr(torch, self.name, None) if self.has_device_memory() else None

    def device_count(self) -> int | None:
        """Devices visible to this process (None: processes share the host, any number of them)."""
        mod = self._torch_module()
        try:
            return int(mod.device_count()) if mod is not None and mod.is_available() else 0
        except RuntimeError:  # a driver that does not answer: no usable device
            return 0

    def synchronize(self) -> None:
        """Wait for the work queued on the device (timings)."""
        mod = self._torch_module()
        if mod is not None:
            mod.synchronize()

    def memory_allocated(self) -> int | None:
        """Bytes the device's allocator holds, after the queued work (None: no such counter)."""
        mod = self._torch_module()
        if mod is None:
            return None
        mod.synchronize()
        return int(mod.memory_allocated())

    def max_memory_allocated(self) -> int | None:
        """Peak bytes the device's allocator held in this process (None: no such counter)."""
        mod = self._torch_module()
        return None if mod is None else int(mod.max_memory_allocated())

    def attention_backend(self, requested):
        """The Megatron ``AttnBackend`` that runs when ``requested`` is asked for."""
        return requested

    # True where packed_sequences_supported() depends on what this machine has installed (CUDA: Transformer
    # Engine), so that a config check on another machine (a dry run) cannot answer it
    packed_sequences_need_installed_software = False

    def packed_sequences_supported(self) -> bool:
        """Whether the attention this device builds here runs packed (THD) sequences."""
        return True

    def packed_sequences_refusal(self, setting: str) -> str:
        """The one line refusing ``setting``=True where packed sequences do not run."""
        return (f"{setting}=True packs sequences (THD), which Megatron's attention without Transformer "
                f"Engine cannot run: set {setting}=False on the {self.name.upper()}")

    def check_packed_sequences(self, setting: str) -> None:
        """Raise a one-line UserError when this device cannot run packed (THD) sequences, which
        ``setting``=True asks for."""
        if not self.packed_sequences_supported():
            from mcore_dapo.errors import UserError

            raise UserError(self.packed_sequences_refusal(setting))

    def check_context_parallel(self, cp: int) -> None:
        """Raise a one-line UserError when this device cannot run context parallelism of size ``cp``."""

    # -- a vLLM engine beside the trainer (sync-bench --rollout vllm, selfcheck's rollout_sync) ----------
    def rollout_ray_resources(self) -> tuple[dict, dict]:
        """(``ray.init`` arguments, the engine actor's options): one device for the actor (Ray sets
        CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES from it), no CPU reserved."""
        raise NotImplementedError(f"no rollout engine resources for {self.name}")

    def checkpoint_engine(self) -> tuple[str, str | None]:
        """(verl checkpoint engine backend, ``checkpoint_engine.custom_backend_module`` or None): the weight
        transport from the trainer to standalone rollout replicas (verl's ``separate_async``) on this device."""
        raise NotImplementedError(f"no checkpoint engine for {self.name}")

    def rollout_engine_settings(self, gpu_memory_utilization: float) -> tuple[dict, dict]:
        """(environment defaults, ``vllm.LLM`` keyword arguments) of the engine on this device: on a device,
        its share of the device's memory, the rest left to the Megatron model beside it."""
        return {}, {"gpu_memory_utilization": gpu_memory_utilization}

    def check_rollout_model(self, head_dim: int) -> None:
        """Raise a one-line UserError when this device's vLLM cannot run the model (nothing refused here)."""

    def device_identity(self) -> str | None:
        """The physical identity of this process's current device, where it can be read (None elsewhere):
        the engine and the sending rank must share one device for verl's IPC weight transfer."""
        return None

    def init_distributed(self, timeout_s: int = 600) -> None:
        """torch.distributed from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...)."""
        import datetime

        import torch.distributed as dist

        if dist.is_initialized():
            return
        self.set_device(local_rank())
        dist.init_process_group(backend=self.backend, timeout=datetime.timedelta(seconds=timeout_s))

    @abstractmethod
    def layer_spec(self, config, vp_stage: int | None = None, pp_rank: int | None = None):
        """The GPT decoder block spec Megatron builds on this device."""

    def seed(self, seed: int) -> None:
        import random

        import numpy as np
        import torch
        from megatron.core import tensor_parallel

        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        tensor_parallel.model_parallel_cuda_manual_seed(seed)

    def expected_stack(self) -> list["StackRequirement"]:
        """The software stack this device's recipe pins (docs/ASCEND.md on Ascend); empty: no fixed stack."""
        return []

    # -- fast paths (docs/PERFORMANCE.md) -------------------------------------------------------------
    def fast_paths(self, cfg, layout, *, dispatcher: str = "alltoall", replay: bool = False,
                   recipe: bool = False, grouped_gemm: bool = True) -> list["FastPath"]:
        """Every performance setting this device decides for ``cfg`` (HFModelConfig) under ``layout``, on or
        off, each with its reason. ``recipe``: for the software the device's recipe installs (Transformer
        Engine on CUDA, MindSpeed on Ascend) instead of what this machine has. ``replay``: router replay
        (R2/R3) is on. ``grouped_gemm=False``: the user turned grouped GEMM off (what needs it goes off too).
        The CPU runs Megatron's unfused path: none is on."""
        why = "the CPU runs Megatron's unfused path (the fused kernels are CUDA or Ascend ones)"
        return [FastPath(s, v, False, why) for s, v in megatron_fast_path_settings(cfg)]

    def fast_path_fields(self, cfg, layout, **kw) -> dict:
        """The TransformerConfig fields of the fast paths that are on (the mapping leaves every one off)."""
        return {p.setting: p.value for p in self.fast_paths(cfg, layout, **kw) if p.on and p.kind == "megatron"}

    def fast_path_flags(self, cfg, layout, **kw) -> dict:
        """The device feature flags (MindSpeed's on Ascend) of the fast paths that are on."""
        return {p.setting: p.value for p in self.fast_paths(cfg, layout, **kw) if p.on and p.kind != "megatron"}

    def configure_flags(self, cfg, layout, overrides: dict | None, context_parallel_size: int = 1, **kw) -> dict:
        """What :meth:`configure` is given for a model: the user's ``override_transformer_config`` over the fast
        paths (their TransformerConfig fields and feature flags, with the dispatcher MindSpeed's MoE features read),
        a fast path asked that cannot run refused first; nothing where the device takes no feature flags."""
        if not self.takes_feature_flags():
            return self.feature_flags(overrides, context_parallel_size)
        overrides = dict(overrides or {})
        kw.setdefault("grouped_gemm", overrides.get("moe_grouped_gemm") is not False)
        self.check_fast_path_overrides(cfg, layout, overrides, **kw)
        # flags that are off are given as False: MindSpeed's repatch sets each given flag on its arguments and
        # keeps those it is not given (mindspeed/megatron_adaptor.py)
        fast = {**self.fast_path_fields(cfg, layout, **kw),
                **{p.setting: (p.value if p.on else False) for p in self.fast_paths(cfg, layout, **kw)
                   if p.kind != "megatron"}}
        if cfg.is_moe:
            fast["moe_token_dispatcher_type"] = kw.get("dispatcher", "alltoall")
        return self.feature_flags({**fast, **overrides}, context_parallel_size)

    def fast_path_warning(self, cfg, layout, **kw) -> str | None:
        """One line naming the fast paths this machine's software cannot run, where the device's recipe
        would run them (None when nothing is lost)."""
        lost = [p for p in self.fast_paths(cfg, layout, **kw) if not p.on and p.missing_software]
        if not lost:
            return None
        causes = list(dict.fromkeys(p.reason.split(" (")[0] for p in lost))  # each reason's cause, in order
        return f"{self.name}: running without {', '.join(p.setting for p in lost)}: {'; '.join(causes)}"

    def check_fast_path_overrides(self, cfg, layout, overrides: dict | None, *, here: bool = True, **kw) -> None:
        """A fast path asked in ``override_transformer_config`` that cannot run: one UserError line naming the
        setting and what is missing. ``here=False`` (a dry run elsewhere): only what does not depend on this
        machine's software is checked."""
        from mcore_dapo.errors import UserError

        overrides = overrides or {}
        kw.setdefault("grouped_gemm", overrides.get("moe_grouped_gemm") is not False)
        for p in self.fast_paths(cfg, layout, **kw):
            asked = overrides.get(p.setting)
            if p.on or not asked or p.setting == "attention_backend":
                continue
            if p.missing_software and not here:
                continue
            raise UserError(f"override_transformer_config.{p.setting}={asked!r} cannot run on {self.name}: "
                            f"{p.reason}; accepted here is {p.setting}=False")

    def describe(self) -> dict:
        return {"device": self.name, "backend": self.backend}


class FastPath:
    """One performance setting as a device decides it: ``setting`` (a TransformerConfig field, or a MindSpeed
    flag when ``kind`` is ``mindspeed``) and its ``value`` when on; ``reason``: what runs it when on, what is
    missing when off; ``missing_software``: off because this machine lacks a package (so a machine with the
    recipe's stack would run it)."""

    __slots__ = ("setting", "value", "on", "reason", "kind", "missing_software")

    def __init__(self, setting: str, value, on: bool, reason: str, kind: str = "megatron",
                 missing_software: bool = False):
        self.setting, self.value, self.on, self.reason = setting, value, bool(on), reason
        self.kind, self.missing_software = kind, bool(missing_software and not on)

    def as_dict(self) -> dict:
        value = getattr(self.value, "name", self.value)  # AttnBackend.flash -> "flash"
        return {"setting": self.setting, "kind": self.kind, "on": self.on, "value": value if self.on else None,
                "reason": self.reason, **({"missing_software": True} if self.missing_software else {})}

    def __repr__(self) -> str:
        return f"FastPath({self.setting}={self.value!r}, on={self.on}, {self.reason!r})"


def megatron_fast_path_settings(cfg) -> list[tuple[str, object]]:
    """The Megatron settings the CUDA recipes turn on (docs/PERFORMANCE.md), in the order reported:
    (TransformerConfig field, value when on); the MoE ones only for a model with experts."""
    moe = [("moe_grouped_gemm", True), ("moe_permute_fusion", True), ("moe_router_fusion", True)]
    return [*(moe if cfg.is_moe else []), ("attention_backend", "flash"), ("apply_rope_fusion", True),
            ("bias_activation_fusion", True), ("gradient_accumulation_fusion", True)]


class StackRequirement:
    """One component of a device's recipe: accepted version prefixes, and where it comes from."""

    def __init__(self, name: str, accepted: tuple[str, ...], source: str, install: str, probe=None):
        self.name, self.accepted, self.source, self.install = name, accepted, source, install
        self._probe = probe

    def installed(self) -> str | None:
        """The installed version (the distribution's metadata unless a probe is given), None when absent."""
        if self._probe is not None:
            return self._probe()
        import importlib.metadata as md

        for dist in (self.name, self.name.replace("_", "-"), self.name.replace("-", "_")):
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                continue
        return None

    def ok(self, installed: str | None) -> bool:
        """Whether ``installed`` is one of the accepted versions (``2.7.1`` accepts ``2.7.1.post2``)."""
        if not installed:
            return False
        base = installed.split("+")[0]
        return any(base == a or base.startswith(a + ".") for a in self.accepted)


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def megatron_imported() -> bool:
    return any(m == "megatron" or m.startswith("megatron.") for m in sys.modules)
