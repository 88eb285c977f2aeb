"""``megatron.numpy2-product``: ``np.product`` in megatron-core's dist_checkpointing before 0.16.

numpy 2.0 removed ``numpy.product`` (``numpy.prod`` is the same function); megatron-core 0.12.1 ...
0.15.x call it when a torch_dist checkpoint is saved or validated with the fully parallel strategies
(``exchange_utils._shard_size``, ``mapping.ShardedTensor.local_coordinates``,
``validation._validate_sharding_for_key_flattened``). verl 0.9.1 needs numpy 2. In those three
modules only, ``np`` is a view of numpy that has ``product`` = ``numpy.prod``.
"""

from __future__ import annotations

import numpy

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements
from mcore_dapo.patching.views import ModuleView

MODULES = (
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.mapping",
    "megatron.core.dist_checkpointing.validation",
)

VIEW = ModuleView(numpy, product=numpy.prod)

@implements("megatron.numpy2-product")
def _numpy_product(patch: Patcher) -> None:
    if hasattr(numpy, "product"):  # numpy 1.x still has it
        return
    patch.replace(VIEW, *(f"{m}:np" for m in MODULES))
