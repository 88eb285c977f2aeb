"""What a device runs fast, and which of the model's features it runs: one :class:`FastPaths` per adapter
(``adapter.fast``), subclassed per device in the device's file (devices/cuda.py, npu.py, cpu.py)."""

from __future__ import annotations


class FastPaths:
    """The performance settings a device decides (docs/PERFORMANCE.md), the feature flags its ``configure`` takes,
    and the attention, packed sequences and context parallelism it runs. This base is what runs anywhere: none
    on, no feature flags."""

    # True where packed_sequences_supported() depends on what this machine has installed (CUDA: Transformer
    # Engine), so that a config check on another machine (a dry run) cannot answer it
    packed_sequences_need_installed_software = False

    def __init__(self, adapter):
        self.adapter = adapter

    @property
    def name(self) -> str:
        return self.adapter.name

    def takes_feature_flags(self) -> bool:
        """Whether the adapter's ``configure`` accepts feature flags (settings that are no TransformerConfig field)."""
        return False

    def feature_flags(self, overrides: dict | None, context_parallel_size: int) -> dict:
        """The feature flags a training engine's TransformerConfig ``overrides`` stand for (none here)."""
        return {}

    def attention_backend(self, requested):
        """The Megatron ``AttnBackend`` that runs when ``requested`` is asked for."""
        return requested

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

    def paths(self, cfg, layout, *, dispatcher: str = "alltoall", replay: bool = False,
              recipe: bool = False, grouped_gemm: bool = True) -> list["FastPath"]:
        """Every performance setting this device decides for ``cfg`` (HFModelConfig) under ``layout``, on or
        off, each with its reason. ``recipe``: for the software the device's recipe installs (Transformer
        Engine on CUDA, MindSpeed on Ascend) instead of what this machine has. ``replay``: router replay
        (R2/R3) is on. ``grouped_gemm=False``: the user turned grouped GEMM off (what needs it goes off too).
        The CPU runs Megatron's unfused path: none is on."""
        why = "the CPU runs Megatron's unfused path (the fused kernels are CUDA or Ascend ones)"
        return [FastPath(s, v, False, why) for s, v in megatron_fast_path_settings(cfg)]

    def fields(self, cfg, layout, **kw) -> dict:
        """The TransformerConfig fields of the fast paths that are on (the mapping leaves every one off)."""
        return {p.setting: p.value for p in self.paths(cfg, layout, **kw) if p.on and p.kind == "megatron"}

    def flags(self, cfg, layout, **kw) -> dict:
        """The device feature flags (MindSpeed's on Ascend) of the fast paths that are on."""
        return {p.setting: p.value for p in self.paths(cfg, layout, **kw) if p.on and p.kind != "megatron"}

    def configure_flags(self, cfg, layout, overrides: dict | None, context_parallel_size: int = 1, **kw) -> dict:
        """What the adapter's ``configure`` is given for a model: the user's ``override_transformer_config`` over
        the fast paths (their TransformerConfig fields and feature flags, with the dispatcher MindSpeed's MoE
        features read), a fast path asked that cannot run refused first; nothing where the device takes no feature
        flags."""
        if not self.takes_feature_flags():
            return self.feature_flags(overrides, context_parallel_size)
        overrides = dict(overrides or {})
        kw.setdefault("grouped_gemm", overrides.get("moe_grouped_gemm") is not False)
        self.check_overrides(cfg, layout, overrides, **kw)
        # flags that are off are given as False: MindSpeed's repatch sets each given flag on its arguments and
        # keeps those it is not given (mindspeed/megatron_adaptor.py)
        fast = {**self.fields(cfg, layout, **kw),
                **{p.setting: (p.value if p.on else False) for p in self.paths(cfg, layout, **kw)
                   if p.kind != "megatron"}}
        if cfg.is_moe:
            fast["moe_token_dispatcher_type"] = kw.get("dispatcher", "alltoall")
        return self.feature_flags({**fast, **overrides}, context_parallel_size)

    def warning(self, cfg, layout, **kw) -> str | None:
        """One line naming the fast paths this machine's software cannot run, where the device's recipe
        would run them (None when nothing is lost)."""
        lost = [p for p in self.paths(cfg, layout, **kw) if not p.on and p.missing_software]
        if not lost:
            return None
        causes = list(dict.fromkeys(p.reason.split(" (")[0] for p in lost))  # each reason's cause, in order
        return f"{self.name}: running without {', '.join(p.setting for p in lost)}: {'; '.join(causes)}"

    def check_overrides(self, cfg, layout, overrides: dict | None, *, here: bool = True, **kw) -> None:
        """A fast path asked in ``override_transformer_config`` that cannot run: one UserError line naming the
        setting and what is missing. ``here=False`` (a dry run elsewhere): only what does not depend on this
        machine's software is checked."""
        from mcore_dapo.errors import UserError

        overrides = overrides or {}
        kw.setdefault("grouped_gemm", overrides.get("moe_grouped_gemm") is not False)
        for p in self.paths(cfg, layout, **kw):
            asked = overrides.get(p.setting)
            if p.on or not asked or p.setting == "attention_backend":
                continue
            if p.missing_software and not here:
                continue
            raise UserError(f"override_transformer_config.{p.setting}={asked!r} cannot run on {self.name}: "
                            f"{p.reason}; accepted here is {p.setting}=False")


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
