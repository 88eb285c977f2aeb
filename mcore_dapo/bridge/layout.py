"""A Megatron parallel layout (TP/PP/EP/ETP/CP/VPP) and its legality for a model."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcore_dapo.bridge.hf_config import HFModelConfig
from mcore_dapo.errors import UserError

# Each Layout field and its name in Megatron (TransformerConfig, initialize_model_parallel), which
# verl's ``megatron`` config section uses too.
MEGATRON_NAMES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}


# The command-line spelling of a layout, the same in every CLI, worker and launcher: one flag per field
# (``Layout.add_args`` / ``Layout.from_args`` / ``Layout.to_argv``).
ARG_HELP = {
    "tp": "tensor parallel size",
    "pp": "pipeline parallel size",
    "vpp": "virtual pipeline stages per pipeline rank (the interleaved schedule; default: none)",
    "cp": "context parallel size",
    "ep": "expert parallel size",
    "etp": "expert tensor parallel size (default: TP)",
}
LAYOUT_FLAGS = ("tp", "pp", "ep", "etp")  # what every layout-taking command reads; cp and vpp where asked


@dataclass(frozen=True)
class Layout:
    """The parallel sizes a model runs under (TP/PP/EP/ETP/CP/VPP): what every converter, worker, the engine
    and the launchers take. Not to be confused with :class:`mcore_dapo.plan.layouts.PlanLayout`, the
    planner's candidate: a Layout plus the uneven first/last pipeline stage sizes it weighs."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int | None = None  # expert tensor parallel; Megatron's default is TP
    cp: int = 1
    vpp: int | None = None

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def dp(self, world_size: int) -> int:
        return world_size // (self.tp * self.pp * self.cp)

    def expert_dp(self, world_size: int) -> int:
        return world_size // (self.expert_tp * self.ep * self.pp)

    def min_world_size(self) -> int:
        import math

        return math.lcm(self.tp * self.pp * self.cp, self.expert_tp * self.ep * self.pp)

    def describe(self) -> str:
        s = f"TP{self.tp} PP{self.pp} EP{self.ep} ETP{self.expert_tp}"
        if self.cp > 1:
            s += f" CP{self.cp}"
        if self.vpp:
            s += f" VPP{self.vpp}"
        return s

    def as_dict(self) -> dict:
        d = asdict(self)
        d["etp"] = self.expert_tp
        return d

    def megatron_sizes(self) -> dict:
        """The layout under Megatron's names (ETP resolved, VPP None when there is none)."""
        d = self.as_dict()
        return {mname: d[field] for field, mname in MEGATRON_NAMES.items()}

    @classmethod
    def add_args(cls, parser, flags: tuple[str, ...] = LAYOUT_FLAGS, unset: bool = False, **defaults) -> None:
        """``--tp --pp --ep --etp`` (and ``--cp`` / ``--vpp`` when in ``flags``) on an argparse parser, with the
        Layout's defaults unless ``defaults`` give others; ``unset``: every default None (the layout comes from
        elsewhere unless given, as ``mcore-convert verify`` reads it from the checkpoint)."""
        base = cls()
        for name in flags:
            default = None if unset else defaults.get(name, getattr(base, name))
            parser.add_argument(f"--{name}", type=int, default=default, help=ARG_HELP[name])

    @classmethod
    def from_args(cls, a) -> "Layout":
        """The layout of parsed :meth:`add_args` flags (a flag left out or None: the Layout's default)."""
        return cls(**{name: getattr(a, name) for name in MEGATRON_NAMES if getattr(a, name, None) is not None})

    def to_argv(self) -> list[str]:
        """The flags :meth:`add_args` reads back into this layout: TP, PP and EP always, ETP and VPP where set,
        CP above 1."""
        out = []
        for name in ("tp", "pp", "vpp", "cp", "ep", "etp"):
            value = getattr(self, name)
            if value is None or (name == "cp" and value == 1):
                continue
            out += [f"--{name}", str(value)]
        return out

    def hydra_overrides(self, prefix: str) -> list[str]:
        """verl's Hydra overrides of this layout under ``prefix`` (``actor_rollout_ref.actor.megatron``): every
        size under Megatron's name (:meth:`megatron_sizes`: ETP resolved), ``null`` for no VPP."""
        return [f"{prefix}.{mname}={'null' if v is None else v}" for mname, v in self.megatron_sizes().items()]

    @classmethod
    def from_megatron(cls, sizes) -> "Layout":
        """The layout of a mapping with Megatron's names (verl's ``megatron`` config section)."""
        vals = {field: sizes.get(mname) for field, mname in MEGATRON_NAMES.items()}
        for field in ("tp", "pp", "ep", "cp"):  # left out or null: Megatron's default, 1
            vals[field] = 1 if vals[field] is None else int(vals[field])
        return cls(**vals)

    def validate(self, cfg: HFModelConfig | None = None, world_size: int | None = None) -> "Layout":
        """Raise a one-line :class:`UserError` for an illegal layout; return self."""
        for name in ("tp", "pp", "ep", "cp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"{name}={v!r} is not accepted: a positive integer is")
        if self.etp is not None and self.etp < 1:
            raise UserError(f"etp={self.etp!r} is not accepted: a positive integer is")
        if world_size is not None:
            dense = self.tp * self.pp * self.cp
            if world_size % dense:
                raise UserError(
                    f"world size {world_size} is not divisible by TP*PP*CP = {dense} "
                    f"({self.describe()}): accepted world sizes are multiples of {dense}"
                )
            expert = self.expert_tp * self.ep * self.pp
            if world_size % expert:
                raise UserError(
                    f"world size {world_size} is not divisible by ETP*EP*PP = {expert} "
                    f"({self.describe()}): accepted world sizes are multiples of {expert}"
                )
        if cfg is None:
            return self
        groups, heads = cfg.num_key_value_heads, cfg.num_attention_heads
        if groups % self.tp:
            ok = [d for d in range(1, groups + 1) if groups % d == 0]
            raise UserError(f"tp={self.tp} does not divide the {groups} KV groups of the model: accepted TP is one of {ok}")
        if heads % self.tp:
            raise UserError(f"tp={self.tp} does not divide the {heads} attention heads")
        if cfg.is_moe:
            if cfg.num_experts % self.ep:
                ok = [d for d in range(1, cfg.num_experts + 1) if cfg.num_experts % d == 0]
                raise UserError(
                    f"ep={self.ep} does not divide the {cfg.num_experts} experts: accepted EP is one of {ok}"
                )
            if cfg.moe_intermediate_size % self.expert_tp:
                raise UserError(
                    f"etp={self.expert_tp} does not divide the expert ffn size {cfg.moe_intermediate_size}"
                )
        elif self.ep > 1:
            raise UserError(f"ep={self.ep} is not accepted for a dense model: accepted is ep=1")
        if cfg.intermediate_size % self.tp and not all(cfg.is_moe_layer(i) for i in range(cfg.num_layers)):
            raise UserError(f"tp={self.tp} does not divide the dense ffn size {cfg.intermediate_size}")
        stages = self.pp * (self.vpp or 1)
        if stages > cfg.num_layers:
            raise UserError(
                f"pp={self.pp} (x vpp={self.vpp or 1}) is more pipeline stages than the {cfg.num_layers} layers"
            )
        if self.vpp and cfg.num_layers % stages:
            raise UserError(
                f"vpp={self.vpp} with pp={self.pp} needs the {cfg.num_layers} layers divisible by {stages}"
            )
        return self
