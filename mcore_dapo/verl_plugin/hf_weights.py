"""The ``bridge`` verl's ``MegatronCheckpointManager`` asks for, on this project's mapping.

verl's checkpoint manager saves and loads the ``model`` slot in the HF format through
"a bridge" (mbridge's ``save_weights(models, path)`` / ``load_weights(models, path)`` when
no Megatron-Bridge provider is given). :class:`HFWeightsIO` is that object for
:class:`~mcore_dapo.verl_plugin.engine.McoreDapoEngine`: loading goes through
:func:`mcore_dapo.runtime.model.load_hf_weights` (each rank reads only its shard), saving through
:func:`mcore_dapo.resharding.owned.owned_hf_tensors`: every rank writes the HF tensors it owns (its experts,
its turn of the dense ones) as part files of its own, in parallel, into a ``.partial`` folder; once every rank's
are written, rank 0 numbers the shards in the checkpoint's tensor order, writes
``model.safetensors.index.json`` last and moves the folder into place. While the checkpoint manager saves in the
background (:attr:`HFWeightsIO.background`), a save returns once this rank's tensors are in host memory: the
part files are written by the background writer's thread and the index at the end of the save
(:mod:`mcore_dapo.io.async_save`). One mapping (:mod:`mcore_dapo.bridge`) serves conversion, resharding and
these checkpoints.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mcore_dapo.io.hf_reader import INDEX
from mcore_dapo.io.hf_shards import SHARD_BYTES


class HFWeightsIO:
    def __init__(self, bridge, dtype):
        self.bridge = bridge
        self.dtype = dtype
        self.background = None  # a BackgroundWriter while a checkpoint is saved in the background
        self.last_save: dict = {}  # of the last finished save: its writer ranks, bytes, tensors (rank 0)

    def load_weights(self, models, weights_path) -> int:
        from mcore_dapo.io.hf_reader import HFReader
        from mcore_dapo.resharding.export import unwrap
        from mcore_dapo.runtime.model import load_hf_weights
        from mcore_dapo.runtime.parallel import parallel_info

        with HFReader(weights_path) as reader:  # verl passes its DDP / Float16Module-wrapped chunks
            return load_hf_weights([unwrap(m) for m in models], self.bridge, reader, parallel_info())

    def save_weights(self, models, weights_path, shard_bytes: int = SHARD_BYTES) -> dict | None:
        """Collective. Returns the index on rank 0 (None while the save runs in the background)."""
        import torch.distributed as dist

        from mcore_dapo.resharding.owned import owned_hf_tensors
        from mcore_dapo.runtime.parallel import parallel_info

        info = parallel_info()
        out = Path(weights_path).absolute()
        partial = out.parent / f".{out.name}.partial"
        if info.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier()
        staged = list(owned_hf_tensors(models, self.bridge, info, self.dtype))  # in host memory
        if self.background is None:
            return finish_weights(self, out, partial, write_parts(staged, partial, info.rank, shard_bytes))
        written = self.background.submit(write_parts, staged, partial, info.rank, shard_bytes)
        self.background.pending.steps.append(lambda: finish_weights(self, out, partial, written.result()))
        return None


def write_parts(staged: list, folder: Path, rank: int, shard_bytes: int) -> dict:
    """This rank's HF tensors into part files of its own (``rank0000N-0000i.safetensors``)."""
    from mcore_dapo.io.hf_shards import ShardWriter

    writer = ShardWriter(folder, shard_bytes, prefix=f"rank{rank:05d}")
    for name, t in staged:
        writer.add(name, t)
    writer.flush()
    return {"parts": writer.parts, "bytes": writer.bytes_written, "tensors": len(staged)}


def finish_weights(io: HFWeightsIO, out: Path, partial: Path, mine: dict) -> dict | None:
    """Collective, once every rank's part files are written: rank 0 checks that every tensor of the model was
    written once, names the shards, writes the index and moves the folder to ``out``."""
    import torch.distributed as dist

    from mcore_dapo.io import output
    from mcore_dapo.io.hf_shards import finalize_shards

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    index = None
    if dist.get_rank() == 0:
        order = list(io.bridge.hf_shapes())
        names = [n for r in every for p in r["parts"] for n in p["names"]]
        if sorted(names) != sorted(order):
            missing, extra = set(order) - set(names), len(names) - len(set(names))
            raise RuntimeError(f"HF checkpoint {out}: {len(missing)} tensors of the model not written "
                               f"({sorted(missing)[:3]}...), {extra} written twice")
        index = finalize_shards(partial, [p for r in every for p in r["parts"]], order)
        keep_beside_weights(out, partial)
        output.finish(partial, out, overwrite=True)
        io.last_save = {"writer_ranks": sum(1 for r in every if r["tensors"]), "bytes": sum(r["bytes"] for r in every),
                        "tensors": len(names)}
    dist.barrier()
    return index


def keep_beside_weights(old: Path, new: Path) -> None:
    """What ``old`` holds beside weights (verl's checkpoint manager writes config.json, the tokenizer and
    generation_config.json into ``model/huggingface`` before it asks for the weights) goes into ``new``, which
    replaces it: without them the folder does not load in transformers."""
    if not old.is_dir():
        return
    for p in old.iterdir():
        weights = p.name.endswith(".safetensors") or p.name == INDEX
        if p.is_file() and not weights and not (new / p.name).exists():
            shutil.copy2(p, new / p.name)
