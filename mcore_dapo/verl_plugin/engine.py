"""verl's Megatron engine with this project's model building, weight loading and weight export.

:class:`McoreDapoEngine` subclasses verl 0.9.1's ``MegatronEngineWithLMHead`` and replaces
these methods (everything else, losses, micro-batching, schedules, optimizer, LR scheduler,
checkpoint manager, is verl's):

* ``_init_device_mesh``: the device adapter's patches (MindSpeed's ``repatch`` on Ascend, the CPU
  patches on the CPU) before verl's ``initialize_model_parallel``;
* ``_build_tf_config``: the one TransformerConfig (:func:`mcore_dapo.runtime.model.model_config`: the bridge's
  mapping for the actor's layout, the device's fast paths, verl's ``override_transformer_config`` on top), and
  the HF weights I/O verl's checkpoint manager saves and loads through (``engine.bridge``; the Bridge itself is
  ``engine.mcore_bridge``);
* ``_build_megatron_module``: the model from :func:`mcore_dapo.runtime.model.build_model` with that config,
  weights from the HF folder through the bridge or from a torch_dist checkpoint
  (``megatron.use_dist_checkpointing``), ``Float16Module`` and Megatron's DDP as verl wraps them;
* ``get_per_tensor_param``: ``(hf_name, tensor)`` from :mod:`mcore_dapo.resharding` (bucketed), an
  offloaded model loaded first as verl's own does;
* ``initialize``: verl's, then its checkpoint manager rebuilt, from the arguments verl built it with, as
  :class:`mcore_dapo.verl_plugin.checkpoint_manager.McoreDapoCheckpointManager` (atomic saves, the distributed
  optimizer in a format another layout loads, one-line checks before a load);
* ``train_batch``: verl's, plus the routing agreement of the last passes in its metrics (MoE);
* ``forward_backward_batch``: first, a checkpoint written in the background is finished if every rank's writes
  are done (the checkpoint manager's ``poll``, at every log-prob computation and update), then verl's (router replay).

:class:`McoreDapoEngine` is what every device shares; verl's ``cpu`` device gets its subclass
:class:`McoreDapoCpuEngine` (load and offload told apart where the device and the host are both "cpu"). Each is
registered at its class statement under its rows of :mod:`mcore_dapo.verl_plugin.registrations`' table. Importing
this module imports verl's Megatron engine, so Megatron: the device is prepared by the entry point's hook before
verl's engine package executes (:func:`registrations.install`; MindSpeed before Megatron on Ascend), the one place;
its patches are applied once, in ``_init_device_mesh``.
"""

from __future__ import annotations

from verl.workers.engine.megatron import MegatronEngineWithLMHead

from mcore_dapo.devices import get_adapter
from mcore_dapo.verl_plugin.registrations import registered


@registered
class McoreDapoEngine(MegatronEngineWithLMHead):
    def _init_device_mesh(self):
        _configure_device(self)  # MindSpeed's repatch must precede initialize_model_parallel
        super()._init_device_mesh()
        get_adapter().mark_model_parallel_initialised()

    def _build_tf_config(self):
        _build_tf_config(self)

    def initialize(self):
        super().initialize()
        if getattr(self, "checkpoint_mananager", None) is not None:  # verl's spelling; None when forward_only
            # verl's manager rebuilt as the plugin's from its own constructor arguments: atomic saves, the
            # optimizer in a format with no gather, checks before a load (verl_plugin/checkpoint_manager.py)
            from mcore_dapo.verl_plugin.checkpoint_manager import McoreDapoCheckpointManager

            self.checkpoint_mananager = McoreDapoCheckpointManager.rebuilt(self.checkpoint_mananager, self)

    def _build_megatron_module(self):
        return _build_megatron_module(self)

    def get_per_tensor_param(self, base_sync_done=False, **kwargs):
        # Called on every trainer rank, by the colocated sync (naive) and by verl's checkpoint engines
        # (separate_async). Every rank yields the same (hf_name, shape, dtype) sequence in the same order:
        # producing a tensor is collective over the ranks, and verl's NCCL engine lets relay ranks cut bucket
        # boundaries from their own stream (nccl_checkpoint_engine.py, _relay_weights). The gloo engine checks
        # it at every sync (mcore_dapo/verl_cpu/checkpoint_engine.py; tests/test_checkpoint_engine.py).
        # As verl's own: offloaded parameters come back first (verl's update_weights offloads them
        # again after the sync when param_offload is set)
        self.load_if_offloaded(load_grad=False)
        return export_weights(self), None

    def load_if_offloaded(self, load_grad: bool) -> None:
        """verl's ``load_megatron_model_to_gpu`` where verl offloads the model (param_offload), as verl's
        get_per_tensor_param and save_checkpoint call it; it needs the DDP buffers' ``param_data``, which
        only the distributed optimizer has (verl's offload needs it too)."""
        if self._is_offload_param:
            from verl.utils.megatron_utils import load_megatron_model_to_gpu

            load_megatron_model_to_gpu(self.module, load_grad=load_grad)

    def on_checkpoint(self, kind: str, step) -> None:
        """Called by the checkpoint manager once a checkpoint is written (``kind="save"``, before it is
        moved into place) or loaded (``"load"``); the audit harness records what the engine holds."""

    def train_batch(self, data, loss_function):
        out = super().train_batch(data, loss_function)
        if out is not None and "metrics" in out:  # routing agreement of the last passes (one value, all ranks)
            out["metrics"].update({k: [v] for k, v in self._mcore_routing_metrics.items()})
        self._mcore_routing_metrics.clear()
        return out

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        from mcore_dapo.verl_plugin import router_replay

        if getattr(self, "checkpoint_mananager", None) is not None:  # verl's spelling; None when forward_only
            self.checkpoint_mananager.poll()  # a checkpoint written in the background: finished once every rank's is

        return router_replay.forward_backward_batch(self, super().forward_backward_batch, data, loss_function,
                                                    forward_only)

    def forward_step(self, batch_iter, model, logits_processor_func, postprocess_micro_batch_func):
        from mcore_dapo.verl_plugin import router_replay

        if self.engine_config.use_remove_padding or getattr(self, "_mcore_route_probe", None) is None:
            return super().forward_step(batch_iter, model, logits_processor_func, postprocess_micro_batch_func)
        return router_replay.bshd_forward_step(self, super().forward_step, batch_iter, model,
                                               logits_processor_func, postprocess_micro_batch_func)


def _configure_device(engine) -> None:
    """Before Megatron's parallel state and RNG tracker exist: the device's patches (the CPU's
    RNG and CUDA-only spots) and feature flags (MindSpeed's ``repatch`` on Ascend)."""
    adapter = get_adapter()
    adapter.apply_patches()
    cfg = engine.engine_config
    if adapter.fast.takes_feature_flags():  # the user's override_transformer_config over the device's fast paths
        model, layout, kw = _fast_path_context(engine)
        flags = adapter.fast.configure_flags(model, layout, cfg.override_transformer_config, cfg.context_parallel_size, **kw)
    else:
        flags = adapter.fast.feature_flags(cfg.override_transformer_config, cfg.context_parallel_size)
    adapter.configure(flags)


def _fast_path_context(engine) -> tuple:
    """(HF config, layout, the fast paths' keyword arguments) of this engine's model."""
    from mcore_dapo.bridge import Layout, load_hf_config

    ec = engine.engine_config
    overrides = dict(ec.override_transformer_config or {})
    replay = str(getattr(getattr(ec, "router_replay", None), "mode", "disabled")) != "disabled"
    kw = dict(dispatcher=overrides.get("moe_token_dispatcher_type") or "alltoall", replay=replay)
    return load_hf_config(engine.model_config.local_path), Layout.from_megatron(ec), kw


def _build_tf_config(engine) -> None:
    """The engine's dtype, its Bridge and the one TransformerConfig it builds its model with: the bridge's mapping,
    then, each over the one before, the device's fast paths, verl's keys outside ``override_transformer_config``
    (:mod:`model_settings`), the user's ``override_transformer_config`` and the router-replay fields of verl's
    ``router_replay.mode`` (:func:`router_replay.config_fields`)."""
    import torch

    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.bridge.megatron_config import split_overrides
    from mcore_dapo.errors import UserError
    from mcore_dapo.runtime.model import model_config
    from mcore_dapo.verl_plugin import model_settings
    from mcore_dapo.verl_plugin.config_checks import PACKING, check_architecture
    from mcore_dapo.verl_plugin.hf_weights import HFWeightsIO
    from mcore_dapo.verl_plugin.router_replay import config_fields

    adapter, ec, mc = get_adapter(), engine.engine_config, engine.model_config
    cfg = check_architecture(mc.local_path)
    if ec.use_remove_padding:
        adapter.fast.check_packed_sequences(PACKING)
    # the engine's attributes verl's code reads
    engine.is_value_model = False
    engine.share_embeddings_and_output_weights = cfg.tie_word_embeddings
    engine.param_dtype = engine.dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        str(ec.dtype), torch.float32)
    engine.mcore_bridge = bridge = Bridge(cfg, Layout.from_megatron(ec))
    # verl's checkpoint manager saves/loads HF weights through "a bridge" (mbridge's interface)
    engine.bridge = HFWeightsIO(bridge, engine.param_dtype)
    engine.provider, engine.vanilla_bridge, engine.peft_cls = None, True, None

    # the user's TransformerConfig fields; verl's megatron.yaml declares some as null (recompute_granularity,
    # ...): not set, so the mapping's stand
    fields, flags = split_overrides(ec.override_transformer_config)
    if flags and not adapter.fast.takes_feature_flags():
        raise UserError(f"override_transformer_config keys {sorted(flags)} are not TransformerConfig fields "
                        "(MindSpeed feature flags are accepted on Ascend only)")
    fields = {k: v for k, v in fields.items() if v is not None}
    # verl's own _build_tf_config sets the replay flag; this one replaces it (R2/R3 would be silently off)
    fields.update(config_fields(cfg, str(ec.router_replay.mode)))
    fields = {**model_settings.dropout_fields(mc.override_config), **fields}  # the user's fields win
    engine.mcore_dispatcher = fields.pop("moe_token_dispatcher_type", "alltoall")
    engine.mcore_freeze_router = model_settings.freeze_moe_router(ec.override_mcore_model_config, "megatron")
    # a fast path asked that this machine cannot run is one line (also before Ray: config_checks.check_fast_paths)
    adapter.fast.check_overrides(cfg, bridge.layout, ec.override_transformer_config,
                                 dispatcher=engine.mcore_dispatcher, replay=bool(fields.get("moe_enable_routing_replay")))
    engine.tf_config = model_config(
        bridge, adapter, dtype={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(engine.param_dtype, "fp32"),
        dispatcher=engine.mcore_dispatcher, wrapped_in_ddp=not ec.forward_only, overrides=fields,
        overrides_key="override_transformer_config.attention_backend", aux_loss_coeff=0.0,
        recompute=model_settings.recompute(mc.enable_gradient_checkpointing, ec.override_transformer_config),
        sequence_parallel=model_settings.sequence_parallel(ec.sequence_parallel, bridge.layout.tp, cfg.is_moe,
                                                           "megatron"))


def _build_megatron_module(engine):
    from mcore_dapo.runtime.model import build_model

    chunks, tf = build_model(engine.mcore_bridge, get_adapter(), config=engine.tf_config)
    engine._mcore_routing_metrics = {}
    if engine.mcore_freeze_router:  # override_mcore_model_config.moe_config.freeze_moe_router, as verl's
        from mcore_dapo.verl_plugin.router_replay import model_routers

        for _, router in model_routers(chunks):
            router.weight.requires_grad_(False)
    if engine.mcore_bridge.cfg.is_moe:  # routing agreement, from the routing maps the routers return
        from mcore_dapo.verl_plugin.router_replay import RouteProbe

        engine._mcore_route_probe = RouteProbe(chunks, tf)
    if engine.engine_config.use_dist_checkpointing:
        import logging

        from mcore_dapo.io.dist_ckpt import load_dist_checkpoint

        path = engine.engine_config.dist_checkpointing_path
        logging.getLogger(__name__).info("loaded torch_dist checkpoint %s (%s decoder keys)", path,
                                         load_dist_checkpoint(chunks, path))
    else:
        engine.bridge.load_weights(chunks, engine.model_config.local_path)
    if tf.fp16 or tf.bf16:  # as verl's make_megatron_module: fp32 logits out of a half-precision model
        from megatron.core.transformer.module import Float16Module

        chunks = [Float16Module(tf, c) for c in chunks]
    if engine.engine_config.forward_only:
        return chunks
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = {"grad_reduce_in_fp32": True, **engine._resolve_override_ddp_config(),
           "use_distributed_optimizer": engine.engine_config.use_distributed_optimizer}
    return [DistributedDataParallel(config=tf, ddp_config=DistributedDataParallelConfig(**ddp), module=c)
            for c in chunks]


def export_weights(engine):
    """``(hf_name, tensor)`` of the trained model for the rollout, through this project's resharding."""
    from mcore_dapo.resharding import WeightExporter
    from mcore_dapo.runtime.parallel import parallel_info

    exporter = getattr(engine, "_mcore_exporter", None)
    if exporter is None:
        exporter = WeightExporter(engine.module, engine.mcore_bridge, parallel_info(), dtype=engine.param_dtype)
        engine._mcore_exporter = exporter
    return exporter.iter_weights()


@registered
class McoreDapoCpuEngine(McoreDapoEngine):
    """The plugin's engine on the CPU, where verl 0.9.1's ``MegatronEngine`` tells the device from the host by name.

    verl's ``MegatronEngine.to`` loads for ``device == get_device_name()`` and offloads for ``"cpu"``; its
    ``save_checkpoint`` asks where the module lives and loads the DDP buffers back
    (verl/workers/engine/megatron/transformer_impl.py). On the CPU the device and the host are both ``cpu``: verl
    would take every call for a load, and its save would load buffers that ``use_distributed_optimizer=False`` does
    not have. This subclass, registered for verl's ``cpu`` device only, tells them apart:

    * ``to``: the train/eval mode contexts' entry loads (marked by :class:`_LoadOnEntry`), every other call (init,
      the contexts' exit, ``update_weights`` after a sync) offloads, through verl's own helpers (param/grad/optimizer
      offload run on the CPU too);
    * ``save_checkpoint``: an offloaded model (and its gradient buffers) loaded for the save, through the plugin's
      checkpoint manager, and offloaded again after it, as verl's own does.
    """

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
        if getattr(self, "_mcore_loading", False):
            return super().to(device, model=model, optimizer=optimizer, grad=grad)
        return offload(self, model=model, optimizer=optimizer, grad=grad)

    def train_mode(self, **kwargs):
        return _LoadOnEntry(self, super().train_mode(**kwargs))

    def eval_mode(self, **kwargs):
        return _LoadOnEntry(self, super().eval_mode(**kwargs))

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None, **kwargs):
        import torch.distributed as dist

        self.load_if_offloaded(load_grad=True)
        self.checkpoint_mananager.save_checkpoint(local_path=local_path, hdfs_path=hdfs_path,
                                                  global_step=global_step, max_ckpt_to_keep=max_ckpt_to_keep)
        dist.barrier()
        if self._is_offload_param:
            offload(self, model=True, optimizer=False, grad=False)


class _LoadOnEntry:
    """verl's train/eval mode context with its entry marked as a load for ``McoreDapoCpuEngine.to`` (the
    entry's ``to(get_device_name())`` reads "cpu" there, as the offloads do)."""

    def __init__(self, engine, ctx):
        self.engine, self.ctx = engine, ctx

    def __enter__(self):
        self.engine._mcore_loading = True
        try:
            return self.ctx.__enter__()
        finally:
            self.engine._mcore_loading = False

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


def offload(engine, model: bool, optimizer: bool, grad: bool) -> None:
    """verl's offload branch of ``MegatronEngine.to`` (verl/workers/engine/megatron/transformer_impl.py):
    the model's DDP buffers to host copies, their storage and the gradient buffers freed; the optimizer's
    state to the CPU (where it already is)."""
    from verl.utils.megatron_utils import offload_megatron_model_to_cpu, offload_megatron_optimizer

    if grad:
        assert model, "Gradient buffers must be moved to device along with model parameters"
    if model:
        offload_megatron_model_to_cpu(engine.module)
    if optimizer and engine.optimizer is not None:
        offload_megatron_optimizer(engine.optimizer)
