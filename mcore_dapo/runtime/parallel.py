"""Distributed start-up in the order every device needs, and the ranks the bridge needs."""

from __future__ import annotations

from dataclasses import dataclass

from mcore_dapo.bridge.layout import Layout
from mcore_dapo.devices import DeviceAdapter, get_adapter


@dataclass(frozen=True)
class ParallelInfo:
    """This rank's coordinates; passed to the bridge instead of reading global state there."""

    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    ep_rank: int
    ep_size: int
    etp_rank: int
    etp_size: int
    dp_rank: int
    dp_size: int

    def group_rank(self, group: str | None) -> tuple[int, int]:
        """(rank, size) in the split group a mapping names."""
        if group == "tp":
            return self.tp_rank, self.tp_size
        if group == "etp":
            return self.etp_rank, self.etp_size
        return 0, 1


def init_parallel(layout: Layout, device: str | DeviceAdapter | None = None, *, seed: int = 1234,
                  flags: dict | None = None) -> DeviceAdapter:
    """prepare -> patches -> feature flags -> process group -> Megatron parallel state -> seeds."""
    adapter = device if isinstance(device, DeviceAdapter) else get_adapter(device)
    adapter.prepare()
    adapter.apply_patches()
    adapter.configure(flags)
    adapter.init_distributed()

    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    layout.validate(world_size=dist.get_world_size())
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(**layout.megatron_sizes())
    adapter.mark_model_parallel_initialised()
    adapter.seed(seed)
    return adapter


def parallel_info() -> ParallelInfo:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    return ParallelInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=ps.get_tensor_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        ep_rank=ps.get_expert_model_parallel_rank(),
        ep_size=ps.get_expert_model_parallel_world_size(),
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        etp_size=ps.get_expert_tensor_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
    )


def shutdown() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
