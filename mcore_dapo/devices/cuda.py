"""NVIDIA adapter: stock Megatron-core, nccl, Transformer Engine spec when TE imports.

On hardware: ``torchrun --nproc-per-node 8 -m mcore_dapo.convert.forward_check --hf-path DIR --tp 1 --ep 8``
(see docs/ARCHITECTURE.md for the full list of device commands).
"""

from __future__ import annotations

import importlib.util

from mcore_dapo.devices.base import DeviceAdapter
from mcore_dapo.devices.fast_paths import FastPath, FastPaths
from mcore_dapo.devices.rollout import RolloutSettings
from mcore_dapo.devices.spec import te_compatible_keys
from mcore_dapo.host import cuda_usable


# The Transformer Engine the CUDA recipe installs: the lower bound of the `cuda` extra (pyproject.toml)
RECIPE_TE = "2.6"


def te_version() -> str | None:
    """The installed Transformer Engine's version as Megatron reads it (``megatron/core/utils.py``
    get_te_version: the ``transformer-engine`` distribution), None when it does not import."""
    if not te_available():
        return None
    import importlib.metadata as md

    for dist in ("transformer-engine", "transformer_engine", "transformer-engine-torch"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    import transformer_engine

    return getattr(transformer_engine, "__version__", "0")


def apex_grad_accum_available() -> bool:
    """apex's ``fused_weight_gradient_mlp_cuda``: Megatron's own ColumnParallelLinear (GPTModel's output
    layer in the TE spec too) refuses gradient_accumulation_fusion without it
    (``megatron/core/tensor_parallel/layers.py``)."""
    return importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None


def _at_least(version: str, minimum: str) -> bool:
    from packaging.version import Version

    return Version(version.split("+")[0]) >= Version(minimum)


def te_available() -> bool:
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:
        return False
    return True


class CudaFastPaths(FastPaths):
    """Transformer Engine's kernels, where the installed TE runs them."""

    # Megatron's local DotProductAttention refuses packed_seq_params; THD needs TEDotProductAttention
    packed_sequences_need_installed_software = True

    def packed_sequences_supported(self) -> bool:
        return self.adapter.use_te()

    def packed_sequences_refusal(self, setting: str) -> str:
        return (f"{setting}=True packs sequences (THD), which Megatron's attention runs only with Transformer "
                f"Engine, and transformer_engine does not import here: accepted on CUDA without Transformer "
                f"Engine is {setting}=False (or install Transformer Engine)")

    def paths(self, cfg, layout, *, dispatcher="alltoall", replay=False, recipe=False, grouped_gemm=True,
              te: str | None = None):
        """Transformer Engine's kernels where the installed TE (``recipe``: the CUDA recipe's, RECIPE_TE; ``te``:
        a given version, with the recipe's other software) runs them, at the versions megatron-core's sources
        name; Megatron's own SwiGLU fusion without TE."""
        from mcore_dapo.patching.registry import installed_version

        recipe = recipe or te is not None
        te = te or (RECIPE_TE if recipe else te_version())
        apex = False if recipe else apex_grad_accum_available()
        megatron = installed_version("megatron-core") or "0.16.1"
        no_te = "transformer_engine does not import here"
        paths = []

        def add(setting, value, need_te: str | None, detail: str, extra_ok: bool = True, extra_why: str = "",
                extra_is_software: bool = False):
            if need_te is not None and te is None:
                paths.append(FastPath(setting, value, False, f"{no_te} ({detail})", missing_software=True))
            elif need_te is not None and not _at_least(te, need_te):
                paths.append(FastPath(setting, value, False, f"needs Transformer Engine >= {need_te}, "
                                      f"{'the recipe installs' if recipe else 'installed is'} {te} ({detail})", missing_software=True))
            elif not extra_ok:
                paths.append(FastPath(setting, value, False, extra_why, missing_software=extra_is_software))
            else:
                on = f"Transformer Engine {te}" if need_te is not None else "Megatron's own kernel"
                paths.append(FastPath(setting, value, True, f"{on} ({detail})"))

        if cfg.is_moe:
            add("moe_grouped_gemm", True, "1.7",
                "TEGroupedMLP; without TE Megatron's local spec builds SequentialMLP, "
                "megatron/core/models/backends.py")
            add("moe_permute_fusion", True, "2.1",
                "transformer_engine.pytorch.permutation, megatron/core/extensions/transformer_engine.py")
            if not _at_least(megatron, "0.13"):
                paths.append(FastPath("moe_router_fusion", True, False,
                                      f"megatron-core {megatron} has no moe_router_fusion "
                                      "(absent from 0.12.1's transformer_config.py)"))
            else:
                add("moe_router_fusion", True, "2.7",
                    "transformer_engine.pytorch.router, imported from TE 2.7.0 by "
                    "megatron/core/extensions/transformer_engine.py", extra_ok=not replay,
                    extra_why="router replay is on: the fused top-k returns before the replay in "
                    "megatron/core/transformer/moe/moe_utils.py topk_routing_with_score_function")
        add("attention_backend", "flash", "0", "TEDotProductAttention's flash kernel")
        add("apply_rope_fusion", True, "1.4",
            "TE's apply_rotary_pos_emb, megatron/core/models/common/embeddings/rope_utils.py")
        add("bias_activation_fusion", True, None,
            "the jit-fused SwiGLU of megatron/core/fusions/fused_bias_swiglu.py")
        add("gradient_accumulation_fusion", True, "0",
            "TE's fuse_wgrad_accumulation, and apex's fused_weight_gradient_mlp_cuda for Megatron's "
            "ColumnParallelLinear (the output layer), megatron/core/tensor_parallel/layers.py",
            extra_ok=apex, extra_is_software=True,
            extra_why="apex's fused_weight_gradient_mlp_cuda is not installed"
            + (" in the recipe's stack (pip install 'mcore-dapo[cuda]')" if recipe else " here")
            + ": Megatron's ColumnParallelLinear (the output layer) refuses the fusion without it "
            "(megatron/core/tensor_parallel/layers.py)")
        return paths


class CudaRollout(RolloutSettings):
    quantizations = ("fp8",)  # verl's blockwise e4m3 (vllm_async_server.py _apply_quantization): H100 and newer

    def ray_resources(self) -> tuple[dict, dict]:
        return {"num_gpus": 1}, {"num_cpus": 0, "num_gpus": 1}  # the first visible GPU, rank 0's cuda:0

    def checkpoint_engine(self) -> tuple[str, str | None]:
        # verl's NCCLCheckpointEngine (verl/checkpoint_engine/nccl_checkpoint_engine.py; needs cupy)
        return "nccl", None


class CudaAdapter(DeviceAdapter):
    name = "cuda"
    backend = "nccl"
    fast_paths_class = CudaFastPaths
    rollout_class = CudaRollout

    @classmethod
    def detect(cls) -> bool:
        return cuda_usable()

    def device(self, local_rank: int):
        import torch

        return torch.device("cuda", local_rank)

    def device_identity(self) -> str | None:
        import torch

        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)

    def set_device(self, local_rank: int) -> None:
        import torch

        torch.cuda.set_device(local_rank)

    def use_te(self) -> bool:
        return te_available()

    def layer_spec(self, config, vp_stage=None, pp_rank=None):
        from mcore_dapo.megatron_compat import decoder_block_spec

        te = self.use_te()
        block = decoder_block_spec(config, use_transformer_engine=te, vp_stage=vp_stage, pp_rank=pp_rank)
        return block if te else te_compatible_keys(block)

    def describe(self) -> dict:
        return {**super().describe(), "transformer_engine": self.use_te()}
