"""The ``bridge`` verl's ``MegatronCheckpointManager`` asks for, on this project's mapping.

verl's checkpoint manager saves and loads the ``model`` slot in the HF format through
"a bridge" (mbridge's ``save_weights(models, path)`` / ``load_weights(models, path)`` when
no Megatron-Bridge provider is given). :class:`HFWeightsIO` is that object for
:class:`~mcore_dapo.verl_plugin.engine.McoreDapoEngine`: loading goes through
:func:`mcore_dapo.runtime.model.load_hf_weights` (each rank reads only its shard), saving
through :class:`mcore_dapo.resharding.WeightExporter` (the gathered full tensors, in the
rollout's names), written by rank 0 into shards plus ``model.safetensors.index.json`` in a
``.partial`` folder moved into place when complete. One mapping (:mod:`mcore_dapo.bridge`)
serves conversion, resharding and these checkpoints.
"""

from __future__ import annotations

from pathlib import Path

from mcore_dapo.io.hf_shards import SHARD_BYTES


class HFWeightsIO:
    def __init__(self, bridge, dtype):
        self.bridge = bridge
        self.dtype = dtype

    def load_weights(self, models, weights_path) -> int:
        from mcore_dapo.io.hf_reader import HFReader
        from mcore_dapo.resharding.export import unwrap
        from mcore_dapo.runtime.model import load_hf_weights
        from mcore_dapo.runtime.parallel import parallel_info

        with HFReader(weights_path) as reader:  # verl passes its DDP / Float16Module-wrapped chunks
            return load_hf_weights([unwrap(m) for m in models], self.bridge, reader, parallel_info())

    def save_weights(self, models, weights_path, shard_bytes: int = SHARD_BYTES) -> dict | None:
        """Collective: every rank takes part in the gathers; rank 0 writes. Returns the index on rank 0."""
        import torch.distributed as dist

        from mcore_dapo.io import output
        from mcore_dapo.io.hf_shards import write_hf_shards
        from mcore_dapo.resharding import WeightExporter
        from mcore_dapo.runtime.parallel import parallel_info

        info = parallel_info()
        weights = WeightExporter(list(models), self.bridge, info, dtype=self.dtype).iter_weights()
        index = None
        if info.rank == 0:
            out = Path(weights_path).absolute()
            out.parent.mkdir(parents=True, exist_ok=True)
            with output.staged(out, overwrite=True) as partial:
                index = write_hf_shards(weights, partial, shard_bytes)
                keep_beside_weights(out, partial)
        else:
            for _ in weights:
                pass
        if dist.is_initialized():
            dist.barrier()
        return index


def keep_beside_weights(old: Path, new: Path) -> None:
    """What ``old`` holds beside weights (verl's checkpoint manager writes config.json, the tokenizer and
    generation_config.json into ``model/huggingface`` before it asks for the weights) goes into ``new``, which
    replaces it: without them the folder does not load in transformers."""
    import shutil

    if not old.is_dir():
        return
    for p in old.iterdir():
        weights = p.name.endswith(".safetensors") or p.name == "model.safetensors.index.json"
        if p.is_file() and not weights and not (new / p.name).exists():
            shutil.copy2(p, new / p.name)
