"""Ascend adapter: MindSpeed before Megatron, feature flags via ``repatch``, hccl.

MindSpeed patches Megatron by object identity across ``sys.modules`` when
``mindspeed.megatron_adaptor`` is imported; anything of Megatron imported (and
captured by value) before that keeps the CUDA code. So :meth:`NpuAdapter.prepare`
refuses to run once Megatron is imported, and :meth:`configure` (MindSpeed's
``repatch`` with feature flags) must come before ``initialize_model_parallel``.

On hardware (A2): ``torchrun --nproc-per-node 8 -m mcore_dapo.harness.logits --device npu --hf-path DIR --tp 4 --ep 2``.
"""

from __future__ import annotations

import importlib
import importlib.util

from mcore_dapo.devices.base import DeviceAdapter, megatron_imported
from mcore_dapo.errors import UserError

ADAPTOR = "mindspeed.megatron_adaptor"


class MindSpeedOrderError(RuntimeError):
    """Megatron was imported before MindSpeed."""


class NpuAdapter(DeviceAdapter):
    name = "npu"
    backend = "hccl"
    rollout_package = "vllm_ascend"
    rollout_install = "pip install 'mcore-dapo[npu]'"

    def __init__(self):
        self._prepared = False
        self._adaptor = None
        self._model_parallel_initialised = False

    @classmethod
    def detect(cls) -> bool:
        return importlib.util.find_spec("torch_npu") is not None

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

    def takes_feature_flags(self) -> bool:
        return True

    def feature_flags(self, overrides: dict | None, context_parallel_size: int) -> dict:
        """MindSpeed takes the whole override dict, flash attention on unless it says otherwise, and
        the CP size (as verl's own NPU engine passes them)."""
        flags = dict(overrides or {})
        flags.setdefault("use_flash_attn", True)
        if context_parallel_size > 1:
            flags["context_parallel_size"] = context_parallel_size
        return flags

    def configure(self, flags: dict | None = None) -> None:
        if not flags:
            return
        if not self._prepared:
            self.prepare()
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

    def layer_spec(self, config, vp_stage=None, pp_rank=None):
        # MindSpeed replaces Transformer Engine's modules with NPU ones, so the TE spec is
        # what builds (and its checkpoint keys are what verl's Ascend path expects).
        from mcore_dapo.megatron_compat import decoder_block_spec

        return decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage, pp_rank=pp_rank)
