"""verl's two classes of the ``hf_cpu`` rollout (:mod:`mcore_dapo.verl_cpu.rollout` serves it): the replica that
starts the server actor, and the trainer worker's adapter that forwards the weights of a sync to it. Importing this
module imports verl's rollout package; :mod:`mcore_dapo.verl_plugin.registrations` registers both classes by their
path, as verl registers its own rollouts (verl imports this module when it first asks for one of them).
"""

from __future__ import annotations

import logging
import os

import ray
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from mcore_dapo.verl_cpu.rollout import BUCKET_BYTES, CpuRolloutServer, server_name

log = logging.getLogger(__name__)


class CpuRolloutReplica(RolloutReplica):
    """Starts one :class:`CpuRolloutServer` actor for this replica (hybrid or standalone)."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self):
        name = server_name(self.replica_rank)
        server = ray.remote(CpuRolloutServer).options(
            name=name, num_cpus=0, max_concurrency=self.max_concurrency,
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.stats.remote()  # constructed (model loaded) before the trainer goes on
        self.servers = [server]
        self._server_handle = server
        self._server_address = name

    async def init_standalone(self):
        # verl's own (verl/workers/rollout/replica.py): a resource pool of the rollout's own slots and a
        # CheckpointEngineWorker per slot, whose server adapter (CpuServerAdapter) forwards what the
        # checkpoint engine receives to this replica's server; then launch_servers
        await super().init_standalone()


class CpuServerAdapter(BaseRollout):
    """The trainer worker's side of the hybrid rollout: forwards weights to its replica's server."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size * \
            self.config.pipeline_model_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.sends = (rank % world) == 0
        self.server = None

    @property
    def is_leader_rank(self) -> bool:  # verl's CheckpointEngineWorker asks
        return self.sends

    def _server(self):
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        return self.server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf_cpu rollout takes named tensors, not {wire_format!r}")
        from verl.workers.rollout.utils import ensure_async_iterator

        global_steps = kwargs.get("global_steps")
        bucket, size = [], 0
        # every rank runs the exporter (it gathers); rank 0 of the replica sends. The server stages the
        # buckets and loads them whole at the end: a sync that fails on the way (a transport's checksum, a
        # killed trainer) leaves the rollout on the weights it had
        try:
            async for name, t in ensure_async_iterator(weights):
                if not self.sends:
                    continue
                bucket.append((name, t.detach().to("cpu", copy=True)))
                size += t.numel() * t.element_size()
                if size >= BUCKET_BYTES:
                    await self._server().stage.remote(bucket)
                    bucket, size = [], 0
            if self.sends:
                await self._server().stage.remote(bucket)
        except BaseException:
            if self.sends:
                await self._server().discard.remote()
            raise
        if self.sends:
            sent = await self._server().commit.remote(global_steps)
            log.info("hf_cpu rollout replica %d received %d tensors", self.replica_rank, sent)
