"""Real MindSpeed on real Megatron, through the NPU adapter, on a machine without an NPU.

Run by tests/test_mindspeed.py in a fresh interpreter whose path starts with the test-only
``torch_npu``/``torchair`` stand-ins (tests/npu_standin), the vendored MindSpeed and the vendored
``megatron.training``/``megatron.legacy`` of Megatron-LM (tests/vendor). Prints one JSON line.

Steps, in the adapter's order (docs/ASCEND.md):
1. the NPU adapter is detected (torch_npu is importable) and ``prepare()`` imports
   ``mindspeed.megatron_adaptor`` before anything imported Megatron: MindSpeed's features patch Megatron;
2. ``configure(flags)`` calls MindSpeed's own ``repatch(args)`` with the flags verl would pass;
3. MindSpeed's patch targets are compared with every target of patches/manifest.toml;
4. our patches for ``npu`` are applied after MindSpeed's;
5. a tiny Qwen3-MoE GPTModel is built with the adapter's layer spec (the TE spec, which MindSpeed's
   Transformer Engine stand-ins build); every parameter must resolve through the bridge, and the
   checkpoint keys are reported.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys


def megatron_loaded() -> bool:
    return any(m == "megatron" or m.startswith("megatron.") for m in sys.modules)


def manifest_targets() -> list[tuple[str, list[str], str]]:
    """(patch id, its devices, target as module.attribute) for every manifest target."""
    from mcore_dapo.patching import registry

    out = []
    for entry in registry.load_manifest().values():
        for t in entry.target:
            out.append((entry.id, list(entry.devices), t.replace(":", ".")))
    return out


def overlaps(ours, theirs: list[str]) -> list[dict]:
    found = []
    for pid, devices, target in ours:
        for t in theirs:
            if fnmatch.fnmatchcase(t, target) or t == target:
                found.append({"patch": pid, "devices": devices, "target": t})
    return found


def npu_is_cpu():
    """Tensors MindSpeed's modules create with ``device="npu"`` are made on the CPU (there is no NPU
    here; Megatron's own modules are told ``use_cpu_initialization``)."""
    from torch.overrides import TorchFunctionMode

    class NpuIsCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            device = kwargs.get("device")
            if isinstance(device, str) and device.split(":")[0] == "npu":
                kwargs["device"] = "cpu"
            return func(*args, **kwargs)

    return NpuIsCpu()


def grouped_experts(adapter, bridge, sequential, hf_path: str, cpu_checkpoint: str | None) -> dict:
    """The model with the NPU adapter's grouped GEMM (``moe_grouped_gemm`` from its fast paths): Megatron's
    TEGroupedMLP on MindSpeed's grouped linear (``linear_fc1.weight{i}``, one parameter per local expert).
    HF weights load through the bridge; its torch_dist shards (what ``dist_checkpointing`` saves and loads:
    key, offset, global shape, data) equal those of the SequentialMLP model built above (``sequential``), so
    either's checkpoint loads into the other; ``cpu_checkpoint``: the keys and global shapes of a checkpoint
    the CPU adapter wrote (local spec) are those of the grouped model's shards; the exporter gives back the HF
    tensors bit for bit. (A torch_dist
    save itself does not run here: MindSpeed's ``preload_tensors`` and Megatron's async writer need a device.)"""
    import torch
    from megatron.core.models.gpt import GPTModel

    from mcore_dapo.bridge.megatron_config import build_transformer_config, gpt_model_kwargs
    from mcore_dapo.io.dist_ckpt import _entries, sharded_state_dict
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.resharding import WeightExporter
    from mcore_dapo.runtime.model import fast_path_overrides, load_hf_weights, local_params
    from mcore_dapo.runtime.parallel import parallel_info

    out: dict = {}
    from mindspeed import megatron_adaptor

    # the flags an engine with the adapter's grouped GEMM gets (the process's first configure applied them)
    megatron_adaptor.repatch(adapter.fast.configure_flags(bridge.cfg, bridge.layout, {"use_fused_rmsnorm": True}, 1,
                                                     dispatcher="allgather"))
    fields = fast_path_overrides(bridge, adapter, {}, dispatcher="allgather")
    out["fast_path_fields"] = {k: v for k, v in fields.items() if not isinstance(v, type)}
    tf = build_transformer_config(bridge.cfg, bridge.layout, fields, dtype="fp32", dispatcher="allgather")
    tf.use_cpu_initialization = True
    tf.perform_initialization = False
    spec = adapter.layer_spec(tf)
    experts = spec.layer_specs[0].submodules.mlp.submodules.experts
    out["experts_module"] = f"{experts.module.__module__}.{experts.module.__qualname__}"
    out["experts_fc1"] = f"{experts.submodules.linear_fc1.__module__}.{experts.submodules.linear_fc1.__qualname__}"
    with npu_is_cpu():
        grouped = GPTModel(config=tf, transformer_layer_spec=spec, pre_process=True, post_process=True,
                           **gpt_model_kwargs(bridge.cfg, bridge.layout))
    info = parallel_info()
    out["expert_param_names"] = sorted(n for n, _ in grouped.named_parameters() if ".layers.0.mlp.experts." in n)
    out["resolved"] = sorted({lp.resolved.megatron for lp in local_params([grouped], bridge, info)}) == \
        sorted({lp.resolved.megatron for lp in local_params([sequential], bridge, info)})
    reader = HFReader(hf_path)
    out["loaded"] = load_hf_weights([grouped], bridge, reader, info)
    out["checkpoint_keys"] = sorted({e.key for e in _entries(sharded_state_dict([grouped]))
                                     if not e.key.endswith("_extra_state")})

    def shards(model):
        """(key, global offset) -> (global shape, data) of every ShardedTensor dist_checkpointing saves and
        loads, factories applied (the gated fc1's gate/up halves): a load reads exactly these."""
        from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

        state = sharded_state_dict([model])
        apply_factories(state)
        return {(e.key, tuple(e.global_offset)): (tuple(e.global_shape), e.data) for e in _entries(state)
                if isinstance(e, ShardedTensor) and not e.key.endswith("_extra_state")}

    # the SequentialMLP model (built above) with the same HF weights: a checkpoint of one loads into the other
    # when both save the same ShardedTensors (key, offset, global shape) holding the same data
    load_hf_weights([sequential], bridge, reader, info)
    g, s = shards(grouped), shards(sequential)
    out["shard_keys_equal"] = sorted(g) == sorted(s)
    out["shards_compared"] = len(g)
    out["expert_shards"] = sum(1 for k, _ in g if ".experts." in k)
    out["shards_differ"] = sorted(f"{k}@{o}" for (k, o) in g if (k, o) not in s or g[(k, o)][0] != s[(k, o)][0]
                                  or not torch.equal(g[(k, o)][1], s[(k, o)][1]))
    if cpu_checkpoint:  # hf2mcore's torch_dist checkpoint written by the CPU adapter (local spec, SequentialMLP)
        from mcore_dapo.io.dist_ckpt import checkpoint_keys

        written = {k: v for k, v in checkpoint_keys(cpu_checkpoint).items() if not k.endswith("_extra_state")}
        shapes = {k: shape for (k, _), (shape, _) in g.items()}
        out["cpu_checkpoint_differ"] = sorted(k for k in set(written) | set(shapes) if written.get(k) != shapes.get(k))
        out["cpu_checkpoint_keys"] = len(written)
    load_hf_weights([grouped], bridge, reader, info)
    exported = {name: t.clone() for name, t in WeightExporter([grouped], bridge, info).iter_weights()}
    out["exported"] = len(exported)
    out["export_differ"] = sorted(n for n, t in exported.items() if not torch.equal(t, reader.get(n).to(t.dtype)))
    return out


def main(hf_path: str, cpu_checkpoint: str | None = None) -> dict:
    out: dict = {"megatron_before_prepare": megatron_loaded()}
    from mcore_dapo.devices import detect, get_adapter

    out["detected"] = detect()
    adapter = get_adapter("npu")
    adapter.prepare()
    import megatron.core
    from mindspeed import megatron_adaptor
    from mindspeed.patch_utils import MindSpeedPatchesManager

    out["megatron_core"] = megatron.core.__version__
    out["mindspeed_file"] = megatron_adaptor.__file__
    out["patches_at_import"] = len(MindSpeedPatchesManager.patches_info)
    import inspect

    out["repatch_signature"] = str(inspect.signature(megatron_adaptor.repatch))

    from mcore_dapo.bridge import Bridge, Layout

    bridge = Bridge.from_hf(hf_path, Layout())
    # what the verl engine gives repatch: the user's override over the adapter's fast paths (the allgather
    # dispatcher: see below)
    flags = adapter.fast.configure_flags(bridge.cfg, bridge.layout, {"use_fused_rmsnorm": True}, 1, dispatcher="allgather")
    adapter.configure(flags)
    applied = [k for k, p in MindSpeedPatchesManager.patches_info.items() if p.is_applied]
    out["flags"] = flags
    out["patches_after_repatch"] = len(applied)
    out["mindspeed_targets_megatron"] = sorted(t for t in applied if t.startswith("megatron."))

    out["overlaps"] = overlaps(manifest_targets(), applied)
    out["our_patches_npu"] = [{"id": s.id, "applies": s.applies} for s in adapter.apply_patches()]

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    from mcore_dapo.bridge.megatron_config import build_transformer_config, gpt_model_kwargs
    from mcore_dapo.runtime.model import local_params
    from mcore_dapo.runtime.parallel import parallel_info

    # one process, gloo: the NPU adapter's hccl needs an NPU
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    ps.initialize_model_parallel()
    adapter.mark_model_parallel_initialised()
    # a second engine in this process (verl's reference beside the actor, KL on): its _init_device_mesh
    # configures again after model-parallel init; the same MindSpeed flags go on, other ones are refused
    def engine_flags(overrides):
        return adapter.fast.configure_flags(bridge.cfg, bridge.layout, overrides, 1, dispatcher="allgather")

    adapter.configure(engine_flags({"use_fused_rmsnorm": True, "recompute_granularity": "full"}))
    out["second_engine_same_flags"] = "ok"
    try:
        adapter.configure(engine_flags({"use_fused_rmsnorm": False}))
        out["second_engine_other_flags"] = "accepted"
    except Exception as e:  # noqa: BLE001 - the refusal's type and line are the result
        out["second_engine_other_flags"] = f"{type(e).__name__}: {e}"
    # The SequentialMLP model: built under the MindSpeed flags an engine with moe_grouped_gemm=False gets
    # (MindSpeed validates its features on every TransformerConfig, and gemm_gradient_accumulation_fusion needs
    # grouped GEMM: mindspeed/features_manager/moe/gmm.py); a process of its own would call repatch with them
    megatron_adaptor.repatch(engine_flags({"use_fused_rmsnorm": True, "moe_grouped_gemm": False}))
    # the allgather dispatcher: alltoall's constructor makes a torch.cuda.Stream, which
    # transfer_to_npu turns into an NPU stream on Ascend and nothing turns into one here;
    # the dispatcher holds no parameters, so the checkpoint keys are the same
    tf = build_transformer_config(bridge.cfg, bridge.layout, dtype="fp32", dispatcher="allgather")
    tf.use_cpu_initialization = True  # no device memory to initialise on here
    spec = adapter.layer_spec(tf)
    sub = spec.layer_specs[0].submodules
    attn = sub.self_attention.submodules
    out["layer_modules"] = {name: f"{m.__module__}.{m.__qualname__}" for name, m in (
        ("linear_qkv", attn.linear_qkv), ("core_attention", attn.core_attention),
        ("linear_proj", attn.linear_proj), ("pre_mlp_layernorm", sub.pre_mlp_layernorm))}
    with npu_is_cpu():
        model = GPTModel(config=tf, transformer_layer_spec=spec, pre_process=True, post_process=True,
                         **gpt_model_kwargs(bridge.cfg, bridge.layout))
    resolved = [(lp.name, lp.resolved.megatron) for lp in local_params([model], bridge, parallel_info())]
    out["params"] = len(resolved)
    out["bridge_params"] = len(bridge.all_resolved)
    out["state_dict_keys"] = sorted(k for k in model.state_dict() if not k.endswith("_extra_state"))
    from mcore_dapo.io.dist_ckpt import _entries, key_layout, sharded_state_dict

    keys = sorted({e.key for e in _entries(sharded_state_dict([model])) if not e.key.endswith("_extra_state")})
    out["checkpoint_keys"] = keys
    out["checkpoint_layout"] = key_layout(keys)
    out["grouped"] = grouped_experts(adapter, bridge, model, hf_path, cpu_checkpoint)
    dist.destroy_process_group()
    del torch
    return out


if __name__ == "__main__":
    from mcore_dapo.errors import UserError

    try:
        result = main(*sys.argv[1:3])
    except UserError as e:
        result = {"error": str(e)}
    sys.stdout.write("\nRESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)
