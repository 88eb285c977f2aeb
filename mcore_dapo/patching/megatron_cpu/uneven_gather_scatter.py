"""``cpu.megatron.uneven-gather-scatter``: TP gathers and reduce-scatters with uneven split sizes,
which gloo lacks, as a padded all_gather and as an all_reduce plus this rank's slice."""

from __future__ import annotations

import torch

from mcore_dapo.patching.megatron_cpu.alltoall_lists import as_list
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "megatron.core.tensor_parallel.mappings"


def _uneven_all_gather(input_, group, sizes):
    import torch.distributed as dist

    width = max(sizes)
    padded = input_.new_zeros((width,) + tuple(input_.shape[1:]))
    padded[: input_.shape[0]] = input_
    out = input_.new_empty((width * len(sizes),) + tuple(input_.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    return torch.cat([out[i * width: i * width + n] for i, n in enumerate(sizes)], dim=0)


def _uneven_reduce_scatter(input_, group, sizes):
    import torch.distributed as dist

    total = input_.contiguous().clone()
    dist.all_reduce(total, group=group)
    start = sum(sizes[: group.rank()])
    return total[start: start + sizes[group.rank()]].contiguous()


def _group(group):
    """megatron-core 0.12.x lets ``group`` default to None, meaning the TP group; 0.16 always passes it."""
    if group is None:
        from megatron.core import parallel_state

        group = parallel_state.get_tensor_model_parallel_group()
    return group


def _gather(original):
    def _gather_along_first_dim(input_, group=None, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or _group(group).size() == 1:
            return original(input_, group, output_split_sizes, use_global_buffer)
        return _uneven_all_gather(input_, _group(group), as_list(output_split_sizes))

    return _gather_along_first_dim


def _scatter(original):
    def _reduce_scatter_along_first_dim(input_, group=None, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or _group(group).size() == 1:
            return original(input_, group, input_split_sizes, use_global_buffer)
        return _uneven_reduce_scatter(input_, _group(group), as_list(input_split_sizes))

    return _reduce_scatter_along_first_dim


@implements("cpu.megatron.uneven-gather-scatter")
def _uneven_gather_scatter(patch: Patcher) -> None:
    patch.wrap(_gather, f"{MODULE}:_gather_along_first_dim")
    patch.wrap(_scatter, f"{MODULE}:_reduce_scatter_along_first_dim")
