"""Each HF tensor of the model written once, by a rank that holds it: no funnel through one rank.

:func:`owned_hf_tensors` yields, on each rank, the HF tensors that rank writes. Every tensor of the
model is yielded by exactly one rank of the whole job:

* the tensors of one pipeline stage by the ranks of that stage;
* an expert's tensors by the expert-parallel rank that holds the expert, its copies on the expert
  data-parallel ranks taking turns (tensor by tensor); split over expert-tensor-parallel ranks, its
  shards are gathered to one of them (a ``gather`` within the ETP group, nothing else);
* a dense tensor by the data-parallel ranks (with context parallel) taking turns, and within the chosen
  copy a tensor-parallel rank: a TP-split tensor's shards are gathered to it over its TP group; a tensor
  every TP rank holds whole (norms, the router) needs no gather at all;
* with tied embeddings the last stage's copy of the embedding is not written (the first stage's is).

Ownership is a function of the parameter's position on the rank, identical on every rank of a TP (ETP)
group and of a data-parallel group, so the gathers match without any exchange of metadata. The tensors come
out through the bridge's ``to_hf`` (the one mapping, :mod:`mcore_dapo.bridge`) in ``dtype``, copied to host
memory: what a background writer may hold while training changes the parameters.
"""

from __future__ import annotations

from typing import Iterator

import torch

from mcore_dapo.bridge import Bridge


def _groups():
    from megatron.core import parallel_state as ps

    dense = (ps.get_data_parallel_rank(with_context_parallel=True),
             ps.get_data_parallel_world_size(with_context_parallel=True), ps.get_tensor_model_parallel_group())
    expert = (ps.get_expert_data_parallel_rank(), ps.get_expert_data_parallel_world_size(),
              ps.get_expert_tensor_parallel_group())
    return dense, expert


@torch.no_grad()
def owned_hf_tensors(chunks, bridge: Bridge, info, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over each TP and ETP group: every rank iterates to the end. See the module's docstring."""
    import torch.distributed as dist

    from mcore_dapo.resharding.export import unwrap
    from mcore_dapo.runtime.model import local_params

    dense, expert = _groups()
    tied = set(bridge.copies.values()) if info.pp_rank != 0 else set()
    for i, lp in enumerate(local_params([unwrap(c) for c in chunks], bridge, info)):
        if lp.resolved.megatron in tied:
            continue
        rep_rank, reps, group = expert if lp.resolved.expert is not None else dense
        g_rank, g_size = dist.get_rank(group), dist.get_world_size(group)
        turn = i % (reps * g_size)
        if turn % reps != rep_rank:
            continue  # another copy of this tensor writes it
        writer = turn // reps  # the rank within the TP (ETP) group that writes it
        split = lp.resolved.mapping.group is not None and g_size > 1
        local = lp.param.detach()
        if split:
            shards = [torch.empty_like(local) for _ in range(g_size)] if g_rank == writer else None
            dist.gather(local.contiguous(), shards, dst=dist.get_global_rank(group, writer), group=group)
        else:
            shards = [local] if g_rank == writer else None
        if shards is None:
            continue
        for name, t in zip(lp.resolved.hf, lp.resolved.mapping.to_hf(shards, bridge.dims)):
            yield name, t.to(device="cpu", dtype=dtype or t.dtype, copy=True).contiguous()

