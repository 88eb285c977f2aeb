"""Ascend adapter: MindSpeed before Megatron, feature flags via ``repatch``, hccl.

MindSpeed patches Megatron by object identity across ``sys.modules`` when
``mindspeed.megatron_adaptor`` is imported; anything of Megatron imported (and
captured by value) before that keeps the CUDA code. So :meth:`NpuAdapter.prepare`
refuses to run once Megatron is imported, and :meth:`configure` (MindSpeed's
``repatch`` with feature flags) must come before ``initialize_model_parallel``.

On hardware (A2): ``torchrun --nproc-per-node 8 -m mcore_dapo.convert.forward_check --device npu --hf-path DIR --tp 4 --ep 2``.
"""

from __future__ import annotations

import importlib
import importlib.util

from mcore_dapo.devices.base import DeviceAdapter, StackRequirement, megatron_imported
from mcore_dapo.devices.fast_paths import FastPath, FastPaths
from mcore_dapo.devices.rollout import RolloutSettings
from mcore_dapo.errors import UserError
from mcore_dapo.host import has_torch_npu

ADAPTOR = "mindspeed.megatron_adaptor"


def _python_version() -> str:
    import platform

    return platform.python_version()


def cann_version() -> str | None:
    """CANN's toolkit version, read from the folder CANN's set_env.sh exports (None: not set up)."""
    import os
    import re
    from pathlib import Path

    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None
    for name in ("ascend_toolkit_install.info", "version.cfg"):
        for f in (Path(home) / name, *Path(home).glob(f"*/{name}")):
            if f.is_file():
                m = re.search(r"version\s*=\s*\"?\[?([0-9][\w.]*)", f.read_text(errors="replace"))
                if m:
                    return m.group(1)
    return "unknown"


MINDSPEED_QS = "MindSpeed 26.1.0_core_r0.12.1 docs/zh/release_notes_core.md"
VERL_QS = "verl docs/ascend_tutorial/ascend_quick_start.rst"

# The A2 recipe (docs/ASCEND.md): MindSpeed's maintained line and what it pairs with.
STACK = (
    StackRequirement("python", ("3.10",), MINDSPEED_QS, "Python 3.10", probe=_python_version),
    StackRequirement("CANN", ("9.1.0", "9.0.0"), MINDSPEED_QS + " (9.1.0; its README says 9.0.0)",
                     "install CANN, then: source <ascend-toolkit>/set_env.sh", probe=cann_version),
    StackRequirement("torch", ("2.7.1",), MINDSPEED_QS, "pip install torch==2.7.1"),
    StackRequirement("torch_npu", ("2.7.1",), MINDSPEED_QS + " (its release 26.1.0 of torch_npu for torch 2.7.1); "
                     + VERL_QS + " (2.7.1)", "pip install torch_npu==2.7.1 (or a 2.7.1.postN build)"),
    StackRequirement("torchvision", ("0.22.1",), VERL_QS, "pip install torchvision==0.22.1"),
    StackRequirement("mindspeed", ("0.12.1",), "MindSpeed 26.1.0_core_r0.12.1 setup.py (version 0.12.1)",
                     "git clone -b 26.1.0_core_r0.12.1 <MindSpeed> && pip install -e MindSpeed"),
    StackRequirement("megatron-core", ("0.12.1",), MINDSPEED_QS,
                     "pip install megatron-core==0.12.1, and Megatron-LM core_v0.12.1 on PYTHONPATH"),
    StackRequirement("verl", ("0.9.1",), "mcore_dapo.versions.SUPPORTED_VERL", "pip install verl==0.9.1"),
    StackRequirement("vllm", ("0.11.0",), VERL_QS,
                     "git clone -b v0.11.0 <vllm> && VLLM_TARGET_DEVICE=empty pip install -e vllm"),
    StackRequirement("vllm-ascend", ("0.11.0rc1", "0.11.0"), VERL_QS,
                     "git clone -b v0.11.0rc1 <vllm-ascend> && pip install -e vllm-ascend"),
)


class MindSpeedOrderError(RuntimeError):
    """Megatron was imported before MindSpeed."""


class NpuFastPaths(FastPaths):
    """MindSpeed's kernels, as feature flags of its ``repatch`` (the adapter's ``configure``)."""

    def takes_feature_flags(self) -> bool:
        return True

    def feature_flags(self, overrides: dict | None, context_parallel_size: int) -> dict:
        """MindSpeed takes the whole override dict, flash attention on unless it says otherwise, and
        the CP size (as verl's own NPU engine passes them)."""
        flags = dict(overrides or {})
        flags.setdefault("use_flash_attn", True)
        if flags.get("use_fused_rotary_pos_emb"):
            # MindSpeed validates its features on every TransformerConfig (transformer_config_post_init_wrapper,
            # mindspeed/core/megatron_basic/arguments_basic.py), and FusedRoPEFeature reads position_embedding_type
            # (mindspeed/features_manager/fusions/fused_rope.py), a GPTModel argument the config has only from
            # repatch's arguments; the bridge builds rope (gpt_model_kwargs)
            flags.setdefault("position_embedding_type", "rope")
        if context_parallel_size > 1:
            flags["context_parallel_size"] = context_parallel_size
        return flags

    def paths(self, cfg, layout, *, dispatcher="alltoall", replay=False, recipe=False, grouped_gemm=True):
        """MindSpeed's kernels (flags of its ``repatch``, read from MindSpeed 26.1.0_core_r0.12.1's
        features_manager), and grouped GEMM. ``repatch`` applies features without their ``validate_args``
        (mindspeed/megatron_adaptor.py); MindSpeed runs those only when a TransformerConfig is built
        (mindspeed/core/megatron_basic/arguments_basic.py), inside a worker: each flag's conditions are
        checked here, so that a flag asked where they fail is one line before Ray."""
        have = recipe or (importlib.util.find_spec("mindspeed") is not None
                          and importlib.util.find_spec("torch_npu") is not None)
        missing = "MindSpeed or torch_npu is not installed here"
        paths = []

        def add(setting, kind, detail, ok=True, why=""):
            if not have:
                paths.append(FastPath(setting, True, False, f"{missing} ({detail})", kind, missing_software=True))
            else:
                paths.append(FastPath(setting, True, ok, detail if ok else why, kind))

        grouped = cfg.is_moe and grouped_gemm
        if cfg.is_moe:
            add("moe_grouped_gemm", "megatron", "TEGroupedMLP on MindSpeed's grouped linear, "
                "torch_npu.npu_grouped_matmul (mindspeed/te/pytorch/module/grouped_linear.py)")
            permute = "npu_moe_token_permute_with_routing_map (mindspeed/features_manager/fusions/fused_moe_permute.py)"
            lacking = [] if recipe or not have else [
                a for a in ("npu_moe_token_permute_with_routing_map", "npu_moe_token_unpermute_with_routing_map")
                if not hasattr(importlib.import_module("torch_npu"), a)]
            if lacking:  # MindSpeed's validate_args would turn it off with a warning; repatch does not validate
                paths.append(FastPath("moe_permute_fusion", True, False, f"torch_npu here lacks {', '.join(lacking)} "
                                      "(CANN >= 8.3.RC1 and torch_npu 7.2.RC1 have them, mindspeed/features_manager/"
                                      "fusions/fused_moe_permute.py)", missing_software=True))
            else:
                add("moe_permute_fusion", "megatron", permute, ok=dispatcher != "allgather",
                    why=f"needs the alltoall dispatcher, the layout has {dispatcher} ({permute})")
        add("use_flash_attn", "mindspeed", "npu_fusion_attention "
            "(mindspeed/features_manager/transformer/flash_attention/fusion_attention_v1_feature.py)")
        add("use_fused_rmsnorm", "mindspeed", "npu_rms_norm (mindspeed/core/fusions/fused_rms_norm.py; "
            "incompatible with tp_2d only, mindspeed/features_manager/tensor_parallel/tp_2d.py)")
        add("bias_activation_fusion", "megatron", "Megatron's fused SwiGLU, whose SwiGLUFunction/BiasSwiGLUFunction "
            "MindSpeed replaces with torch_npu.npu_swiglu at import (mindspeed/features_manager/fusions/"
            "fused_bias_swiglu.py)")
        add("use_fused_swiglu", "mindspeed", "set as the recipes set it: parsed in mindspeed/features_manager/"
            "megatron_basic/megatron_basic.py and read by no other code of this MindSpeed (the NPU SwiGLU runs "
            "through bias_activation_fusion)")
        add("use_fused_rotary_pos_emb", "mindspeed", "npu_rotary_mul; needs position_embedding_type=rope, "
            "which Qwen3 is (mindspeed/features_manager/fusions/fused_rope.py)")
        if cfg.is_moe:
            add("gemm_gradient_accumulation_fusion", "mindspeed", "the grouped GEMM's weight gradient accumulated "
                "in place; needs moe_grouped_gemm (mindspeed/features_manager/moe/gmm.py)", ok=grouped,
                why="needs moe_grouped_gemm, which is off (mindspeed/features_manager/moe/gmm.py validates it "
                "on every TransformerConfig)")
            add("moe_permutation_async_comm", "mindspeed", "read by the alltoall_seq and moe_tp_extend_ep "
                "paths only (mindspeed/features_manager/moe/tp_extend_ep.py, moe_alltoall_overlap.py); "
                "set as the recipes set it")
            overlap_why = []
            if layout.ep <= 1:
                overlap_why.append(f"needs expert_model_parallel_size > 1, the layout has {layout.ep}")
            if dispatcher != "alltoall":
                overlap_why.append(f"needs the alltoall dispatcher, the layout has {dispatcher}")
            if not grouped:
                overlap_why.append("needs moe_grouped_gemm, which is off")
            add("moe_alltoall_overlap_comm", "mindspeed", "the experts' all-to-all overlapped with compute "
                "(mindspeed/features_manager/moe/moe_alltoall_overlap.py: EP > 1, alltoall, grouped GEMM)",
                ok=not overlap_why, why="; ".join(overlap_why) + " (mindspeed/features_manager/moe/moe_alltoall_overlap.py)")
        return paths


# vllm-ascend v0.11.0rc1 vllm_ascend/platform.py, check_and_update_config: FULL_AND_PIECEWISE runs as PIECEWISE,
# FULL_DECODE_ONLY as a full decode graph, FULL falls back to eager (NONE) with an info line
NPU_CUDAGRAPH_MODES = ("PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
NZ_VAR = "VLLM_ASCEND_ENABLE_NZ"


class NpuRollout(RolloutSettings):
    package = "vllm_ascend"
    install = "pip install 'mcore-dapo[npu]'"

    def check_weight_format(self, key: str, env) -> None:
        # vllm-ascend (v0.11.0rc1 vllm_ascend/ops/linear.py, ops/common_fused_moe.py) casts bf16 weights to NZ once
        # after loading; the step's weight sync writes the trainer's ND weights into them (verl 0.9.1 sets 0 in
        # its vLLM workers where unset: verl/workers/rollout/vllm_rollout/utils.py)
        if str(env.get(NZ_VAR, "0")).strip() != "0":
            raise UserError(f"{NZ_VAR}={env.get(NZ_VAR)} with the vLLM rollout on trainer.device=npu: vllm-ascend "
                            "then keeps the rollout's weights in NZ format, which the weight sync of every step does "
                            f"not write; accepted is {NZ_VAR}=0 (or unset: verl sets 0)")

    def graph_mode(self, key: str, mode: str, env) -> str:
        name = f"{key}.engine_kwargs.vllm.compilation_config.cudagraph_mode"
        if mode not in NPU_CUDAGRAPH_MODES:
            raise UserError(f"{name}={mode} with enforce_eager=False on trainer.device=npu: vllm-ascend runs it eager; "
                            f"accepted are {', '.join(NPU_CUDAGRAPH_MODES)} (or enforce_eager=True)")
        if str(env.get("ASCEND_LAUNCH_BLOCKING", "0")).strip() == "1":  # vllm-ascend v0.11.0rc1 platform.py raises
            raise UserError("ASCEND_LAUNCH_BLOCKING=1 with enforce_eager=False on trainer.device=npu: vllm-ascend "
                            "refuses ACL graphs with it; accepted are ASCEND_LAUNCH_BLOCKING unset or 0, or "
                            f"{key}.enforce_eager=True")
        return "PIECEWISE" if mode == "FULL_AND_PIECEWISE" else mode  # what vllm-ascend runs of it

    def ray_resources(self) -> tuple[dict, dict]:
        # Ray's NPU accelerator manager (ray/_private/accelerators/npu.py) sets ASCEND_RT_VISIBLE_DEVICES
        return {"resources": {"NPU": 1}}, {"num_cpus": 0, "resources": {"NPU": 1}}

    def checkpoint_engine(self) -> tuple[str, str | None]:
        # verl's HCCLCheckpointEngine registers the name "nccl" on Ascend (verl/checkpoint_engine/__init__.py,
        # hccl_checkpoint_engine.py); there is no "hccl" name in verl 0.9.1's registry
        return "nccl", None


class NpuAdapter(DeviceAdapter):
    name = "npu"
    backend = "hccl"
    fast_paths_class = NpuFastPaths
    rollout_class = NpuRollout

    def __init__(self):
        super().__init__()
        self._prepared = False
        self._adaptor = None
        self._model_parallel_initialised = False
        self._applied_flags: dict | None = None

    @classmethod
    def detect(cls) -> bool:
        return has_torch_npu()

    def prepare(self) -> None:
        if self._prepared:
            return
        if megatron_imported() and ADAPTOR not in __import__("sys").modules:
            raise MindSpeedOrderError(
                "Megatron was imported before MindSpeed: import mcore_dapo (or call "
                "devices.get_adapter('npu').prepare()) before anything that imports megatron, "
                "so that mindspeed.megatron_adaptor can patch it"
            )
        import torch  # noqa: F401  (MindSpeed expects torch first)

        if importlib.util.find_spec("torch_npu") is not None:
            importlib.import_module("torch_npu")
        try:
            self._adaptor = importlib.import_module(ADAPTOR)
        except ImportError as e:
            raise UserError(
                f"mindspeed is not importable ({e}): install MindSpeed from its source repository at the "
                "branch matching megatron-core (see README, 'Ascend')"
            ) from None
        self._prepared = True

    def mark_model_parallel_initialised(self) -> None:
        self._model_parallel_initialised = True

    def configure(self, flags: dict | None = None) -> None:
        """MindSpeed's ``repatch(flags)``, once per process: a second engine in the process (verl's reference
        beside the actor, with KL on) finds Megatron's parallel state already initialised; it goes on when
        its MindSpeed feature flags (the keys that are not TransformerConfig fields) are those applied,
        and is refused in one line when they differ (MindSpeed cannot re-patch after that point)."""
        if not flags:
            return
        if not self._prepared:
            self.prepare()
        if self._applied_flags is not None:
            asked, applied = _feature_flags(flags), _feature_flags(self._applied_flags)
            differ = sorted(k for k in set(asked) | set(applied) if asked.get(k) != applied.get(k))
            if not differ:
                return
        if self._applied_flags is not None and self._model_parallel_initialised:
            raise MindSpeedOrderError(
                f"MindSpeed feature flags {differ} differ from those this process applied before "
                "initialize_model_parallel: give the actor and the reference the same MindSpeed flags"
            )
        if self._model_parallel_initialised:
            raise MindSpeedOrderError(
                "MindSpeed feature flags must be applied before initialize_model_parallel"
            )
        repatch = getattr(self._adaptor, "repatch", None)
        if repatch is None:
            raise MindSpeedOrderError(
                f"this MindSpeed has no {ADAPTOR}.repatch, so feature flags {sorted(flags)} cannot be "
                "applied: use the MindSpeed branch that matches megatron-core (it provides repatch)"
            )
        repatch(dict(flags))
        self._applied_flags = dict(flags)

    def device(self, local_rank: int):
        import torch

        return torch.device("npu", local_rank)

    def device_count(self) -> int:
        if importlib.util.find_spec("torch_npu") is None:
            return 0
        importlib.import_module("torch_npu")  # torch.npu exists once torch_npu is imported
        return super().device_count()

    def set_device(self, local_rank: int) -> None:
        import torch

        torch.npu.set_device(local_rank)

    def apply_patches(self):
        self.prepare()
        return super().apply_patches()

    def expected_stack(self) -> list[StackRequirement]:
        return list(STACK)

    def layer_spec(self, config, vp_stage=None, pp_rank=None):
        # MindSpeed replaces Transformer Engine's modules with NPU ones, so the TE spec is
        # what builds (and its checkpoint keys are what verl's Ascend path expects).
        from mcore_dapo.megatron_compat import decoder_block_spec

        return decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage, pp_rank=pp_rank)


def _feature_flags(flags: dict) -> dict:
    """The MindSpeed feature flags among ``flags`` (what is not a TransformerConfig field)."""
    from mcore_dapo.bridge.megatron_config import split_overrides

    return split_overrides(flags)[1]
