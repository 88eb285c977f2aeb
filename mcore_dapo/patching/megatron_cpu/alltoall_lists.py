"""``cpu.megatron.alltoall-split-lists``: the alltoall dispatcher's split sizes as Python lists (gloo)."""

from __future__ import annotations

import torch

from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements


def as_list(splits):
    """Split sizes (tensor, numpy array, list) as a list of ints; None stays None."""
    if splits is None or isinstance(splits, list):
        return splits
    if isinstance(splits, torch.Tensor):
        return [int(x) for x in splits.tolist()]
    return [int(x) for x in splits]


def _with_lists(original):
    def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None):
        return original(group, input_, as_list(output_split_sizes_), as_list(input_split_sizes))

    return all_to_all


@implements("cpu.megatron.alltoall-split-lists")
def _alltoall_lists(patch: Patcher) -> None:
    patch.wrap(_with_lists, "megatron.core.transformer.moe.token_dispatcher:all_to_all")
