"""The plugin's Megatron engine on the CPU: :mod:`mcore_dapo.verl_plugin.engine`'s ``McoreDapoEngine`` where
verl 0.9.1's ``MegatronEngine`` tells the device from the host by name.

verl's ``MegatronEngine.to`` loads for ``device == get_device_name()`` and offloads for ``"cpu"``; its
``save_checkpoint`` asks where the module lives and loads the DDP buffers back
(verl/workers/engine/megatron/transformer_impl.py). On the CPU the device and the host are both ``cpu``:
verl would take every call for a load, and its save would load buffers that
``use_distributed_optimizer=False`` does not have. This subclass, registered for verl's ``cpu`` device
only, tells them apart:

* ``to``: the train/eval mode contexts' entry loads (marked by :class:`_LoadOnEntry`), every other call
  (init, the contexts' exit, ``update_weights`` after a sync) offloads, through verl's own helpers
  (param/grad/optimizer offload run on the CPU too);
* ``save_checkpoint``: an offloaded model (and its gradient buffers) loaded for the save, through the
  plugin's checkpoint manager, and offloaded again after it, as verl's own does.

Importing this module imports verl's Megatron engine (through :mod:`mcore_dapo.verl_plugin.engine`); it registers
nothing (:mod:`mcore_dapo.verl_plugin.registrations` does; the last line finishes a registration the entry point
asked for while this module executed).
"""

from __future__ import annotations


from mcore_dapo.verl_plugin import registrations
from mcore_dapo.verl_plugin.engine import McoreDapoEngine


class McoreDapoCpuEngine(McoreDapoEngine):
    """The plugin's engine for verl's ``cpu`` device (registered by mcore_dapo/verl_plugin/registrations.py)."""

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


registrations.complete(__name__)  # rows the entry point asked for while this module executed
