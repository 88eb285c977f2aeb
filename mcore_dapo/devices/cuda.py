"""NVIDIA adapter: stock Megatron-core, nccl, Transformer Engine spec when TE imports.

On hardware: ``torchrun --nproc-per-node 8 -m mcore_dapo.harness.logits --hf-path DIR --tp 1 --ep 8``
(see docs/ARCHITECTURE.md for the full list of device commands).
"""

from __future__ import annotations

import importlib.util

from mcore_dapo.devices.base import DeviceAdapter
from mcore_dapo.devices.spec import te_compatible_keys


def te_available() -> bool:
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


class CudaAdapter(DeviceAdapter):
    name = "cuda"
    backend = "nccl"

    @classmethod
    def detect(cls) -> bool:
        import torch

        return torch.cuda.is_available() and torch.version.cuda is not None

    def device(self, local_rank: int):
        import torch

        return torch.device("cuda", local_rank)

    def set_device(self, local_rank: int) -> None:
        import torch

        torch.cuda.set_device(local_rank)

    def use_te(self) -> bool:
        return te_available()

    # Megatron's local DotProductAttention refuses packed_seq_params; THD needs TEDotProductAttention
    packed_sequences_need_installed_software = True

    def packed_sequences_supported(self) -> bool:
        return self.use_te()

    def packed_sequences_refusal(self, setting: str) -> str:
        return (f"{setting}=True packs sequences (THD), which Megatron's attention runs only with Transformer "
                f"Engine, and transformer_engine does not import here: accepted on CUDA without Transformer "
                f"Engine is {setting}=False (or install Transformer Engine)")

    def layer_spec(self, config, vp_stage=None, pp_rank=None):
        from mcore_dapo.megatron_compat import decoder_block_spec

        te = self.use_te()
        block = decoder_block_spec(config, use_transformer_engine=te, vp_stage=vp_stage, pp_rank=pp_rank)
        return block if te else te_compatible_keys(block)

    def describe(self) -> dict:
        return {**super().describe(), "transformer_engine": self.use_te()}
