"""``verl.cpu.offload-keeps-host-params``: verl's offload of a model without DDP (the reference model)
does not free parameters that already live on the host.

``offload_megatron_model_to_cpu`` (verl 0.9.1, verl/utils/megatron_utils.py) moves each parameter of
a model that is not wrapped in Megatron's DDP with ``param.data = param.data.to("cpu")`` and then,
when ``_can_safely_resize_storage(old_data)`` says the old tensor owns its storage, frees it with
``old_data.storage().resize_(0)``. For a parameter already on the CPU, ``to("cpu")`` returns the
same tensor: the parameter's own storage is freed and its weights are lost (seen on verl's ``cpu``
platform with a ``torch.nn.Linear``: storage size 0 after the offload). On verl's ``cpu`` platform
``_can_safely_resize_storage`` answers False for a CPU tensor; for any other tensor, and on every
other platform, verl's function answers.
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "verl.utils.megatron_utils"


def _keep_host_tensors(original):
    def _can_safely_resize_storage(tensor):
        from mcore_dapo.host import on_cpu

        if tensor.device.type == "cpu" and on_cpu():
            return False  # the "offloaded" tensor is this one: freeing it frees the weights
        return original(tensor)

    return _can_safely_resize_storage


@implements("verl.cpu.offload-keeps-host-params")
def _offload_keeps_host_params(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(_keep_host_tensors,
                                                          f"{MODULE}:_can_safely_resize_storage")))
