"""A Qwen3-MoE model configured the way stock verl configures it, loading and saving torch_dist checkpoints.

Proves that the checkpoints this project writes load where a standard configuration of the model
loads them, and that what such a model saves converts back. Run under torchrun::

    torchrun --nproc-per-node 2 -m mcore_dapo_checks.foreign_loader --hf-path DIR --load CKPT \\
        --reference REF.pt --ep 2 [--save OUT]

The TransformerConfig is verl 0.9.1's own ``hf_to_mcore_config_qwen3moe`` (``moe_layer_freq``
left at its default, 1, as verl, Megatron-LM's recipes and MindSpeed-LLM leave it); the
GPTModel is built by verl's ``Qwen3MoEModel`` initializer; ``--load`` goes through verl's
``load_mcore_dist_weights`` (what verl's Megatron engine calls for
``megatron.use_dist_checkpointing``) and ``--save`` is a plain ``dist_checkpointing.save`` of
the model's sharded state dict. On this machine three things differ from a GPU run, all set in
:data:`CPU_OVERRIDES` or here: the layer spec is the CPU device adapter's (Megatron's local
modules with the Transformer Engine spec's checkpoint keys) instead of the TE spec; the
overrides below replace what needs CUDA kernels; the parallel sizes verl reads from Megatron's
parallel state come from :func:`mcore_dapo.runtime.parallel.init_parallel`, run first.

Without ``--load``, the weights come from the HF checkpoint through this project's bridge;
``--per-layer`` sets ``moe_layer_freq`` to a per-layer list, as this project's earlier versions
did, so that ``--save`` writes the per-layer keys those versions wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Overrides of verl's config for the CPU, each for one reason:
CPU_OVERRIDES = dict(
    use_cpu_initialization=True,  # no CUDA device to initialise the parameters on
    moe_grouped_gemm=False,       # TEGroupedMLP needs Transformer Engine: SequentialMLP, which
                                  # writes the same checkpoint keys
    persist_layer_norm=False,     # Apex / TE fused kernels; the CPU spec's norms are plain torch
    bias_activation_fusion=False,  # fused CUDA kernels (verl turns them on for GPUs)
    bias_dropout_fusion=False,
    masked_softmax_fusion=False,
)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.foreign_loader")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--load", default=None, help="torch_dist checkpoint to load with verl's loader")
    ap.add_argument("--reference", default=None, help="HF logits to compare with (python -m mcore_dapo.convert.hf_reference)")
    ap.add_argument("--save", default=None, help="folder to save the model's torch_dist checkpoint into")
    ap.add_argument("--per-layer", action="store_true", help="moe_layer_freq as a per-layer list")
    from mcore_dapo.bridge.layout import Layout

    Layout.add_args(ap, ("tp", "ep"))
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def stock_model(hf_path: str, per_layer: bool):
    """GPTModel from verl's config converter and initializer, with the CPU adapter's layer spec."""
    import torch
    from transformers import AutoConfig
    from verl.models.mcore.config_converter import hf_to_mcore_config_qwen3moe
    from verl.models.mcore.model_initializer import Qwen3MoEModel

    from mcore_dapo.devices import get_adapter

    hf_config = AutoConfig.from_pretrained(hf_path)
    overrides = dict(CPU_OVERRIDES)
    if per_layer:
        overrides["moe_layer_freq"] = [1] * hf_config.num_hidden_layers
    tf = hf_to_mcore_config_qwen3moe(hf_config, torch.float32, **overrides)

    class CpuSpecQwen3MoE(Qwen3MoEModel):
        def get_transformer_layer_spec(self, vp_stage=None):
            return get_adapter("cpu").layer_spec(self.tfconfig)

    model = CpuSpecQwen3MoE(tf, hf_config).initialize(
        pre_process=True, post_process=True,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)))
    return model, tf


def _from_hf(model, hf_path: str, layout) -> None:
    from mcore_dapo.bridge import Bridge
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.model import load_hf_weights
    from mcore_dapo.runtime.parallel import parallel_info

    with HFReader(hf_path) as reader:
        load_hf_weights([model], Bridge.from_hf(hf_path, layout), reader, parallel_info())


def _logits_diff(model, reference: str) -> float:
    """max |logit - HF logit| over the real tokens of the reference prompts, on every rank."""
    import torch
    import torch.distributed as dist

    from mcore_dapo.runtime.forward import run_schedule

    ref = torch.load(reference)
    model.eval()
    with torch.no_grad():
        logits = run_schedule([model], ref["tokens"], micro_batch_size=1)
    real = ref["attention_mask"].bool() if "attention_mask" in ref else torch.ones_like(ref["tokens"], dtype=torch.bool)
    diff = (logits[..., : ref["logits"].shape[-1]].float()[real] - ref["logits"].float()[real]).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return diff.item()


def run(a) -> dict:
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
    from verl.utils.model import load_mcore_dist_weights

    from mcore_dapo.bridge import Layout
    from mcore_dapo.io.dist_ckpt import checkpoint_keys, key_layout
    from mcore_dapo.runtime.parallel import init_parallel

    layout = Layout.from_args(a)
    init_parallel(layout, "cpu")
    model, tf = stock_model(a.hf_path, a.per_layer)
    result = {"layout": layout.describe(), "moe_layer_freq": tf.moe_layer_freq,
              "loaded_from": "checkpoint" if a.load else "hf"}
    if not a.load:
        _from_hf(model, a.hf_path, layout)
    else:
        try:
            load_mcore_dist_weights([model], a.load)
        except (Exception, CheckpointException) as e:  # a refusal is a result here, not a crash
            return {**result, "load_error": f"{type(e).__name__}: {e}"}
    if a.reference:
        result["max_abs_diff"] = _logits_diff(model, a.reference)
    if a.save:
        Path(a.save).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), a.save)
        result["saved_key_layout"] = key_layout(checkpoint_keys(a.save))
    return result


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
