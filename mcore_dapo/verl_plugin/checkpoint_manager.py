"""The plugin's checkpoint manager: verl 0.9.1's ``MegatronCheckpointManager`` (verl/utils/checkpoint/
megatron_checkpoint_manager.py) with an atomic save, in the background with ``checkpoint.async_save``, the
distributed optimizer in a format with no gather, and the checks of :mod:`mcore_dapo.verl_plugin.checkpoint`
before a load (why: docs/VERL_PLUGIN.md, "Checkpoints and resume").

A save: verl's writes into ``.<actor>.partial``; once every rank's writes are done (at once, or in the background
where a later training step's :meth:`~McoreDapoCheckpointManager.poll` finds them done), rank 0 adds the record
(every file with its size), moves the folder into place, uploads it and writes the tracker; older checkpoints are
removed only then.

verl's ``MegatronEngine.initialize`` constructs ``MegatronCheckpointManager`` by name
(verl/workers/engine/megatron/transformer_impl.py); the plugin's engine then rebuilds it as this class
(:meth:`McoreDapoCheckpointManager.rebuilt`) from the arguments verl's was built with, read back from the
attributes verl's constructor stores them under: nothing of verl's ``initialize`` is copied, and a constructor
argument verl adds that is not stored under its own name stops the engine's start in one line.
"""

from __future__ import annotations

import functools
import inspect
import json
import shutil
from pathlib import Path

from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

from mcore_dapo.verl_plugin.checkpoint import (FORMAT, FULL_FORMAT, RESUME_FILE, RNG_KEY, TRACKER, check,
                                               engine_record, file_sizes, layout_name, optimizer_format,
                                               partial_path, rng_layout, step_of)

# constructor arguments verl's manager stores under another name (verl/utils/checkpoint/checkpoint_manager.py)
STORED_AS = {"optimizer_scheduler": "lr_scheduler"}


def constructor_arguments(mgr) -> dict:
    """The arguments ``mgr`` (verl's ``MegatronCheckpointManager``) was constructed with, from its attributes."""
    params = inspect.signature(type(mgr).__init__).parameters
    names = [n for n, p in params.items() if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    missing = [n for n in names if not hasattr(mgr, STORED_AS.get(n, n))]
    if missing:
        raise RuntimeError(f"verl's MegatronCheckpointManager takes {missing}, which it does not keep as attributes "
                           f"of the same name: this verl is not the one the plugin supports (mcore_dapo.versions)")
    return {n: getattr(mgr, STORED_AS.get(n, n)) for n in names}


_WRITER: list = []


def background_writer():
    """The process's one background writer (its persistent worker started now), shared by its engines."""
    if not _WRITER:
        from mcore_dapo.devices import get_adapter
        from mcore_dapo.io.async_save import BackgroundWriter

        _WRITER.append(BackgroundWriter(get_adapter().name))
        _WRITER[0].start()
    return _WRITER[0]


class McoreDapoCheckpointManager(MegatronCheckpointManager):
    """verl's ``MegatronCheckpointManager`` with an atomic save (in the background with ``checkpoint.async_save``),
    the optimizer in a format with no gather, and the checks before a load (a subclass: verl's own code runs,
    nothing of verl is patched)."""

    rng_per_rank = True  # how this manager saves (and, unless a load says otherwise, loads) RNG states

    def get_rng_state(self, use_dist_ckpt: bool = True, data_parallel_random_init: bool = False):
        if not use_dist_ckpt or self.use_megatron_fsdp or not self.rng_per_rank:
            return super().get_rng_state(use_dist_ckpt, data_parallel_random_init)
        # verl's is one ShardedObject per (PP, TP) rank with the data-parallel rank as replica: the other
        # data-parallel ranks load rank (pp, tp, dp 0)'s, and under EP their expert-parallel tracker state
        # (seeded per EP rank by model_parallel_cuda_manual_seed) is not theirs. One object per rank instead.
        import torch.distributed as dist
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        states = super().get_rng_state(use_dist_ckpt=False, data_parallel_random_init=data_parallel_random_init)
        return ShardedObject(RNG_KEY, states, (dist.get_world_size(),), (dist.get_rank(),), replica_id=0)

    def _build_sharded_state_dict_metadata(self):
        metadata = super()._build_sharded_state_dict_metadata()
        if self.use_distributed_optimizer and not self.use_megatron_fsdp:
            # the format of this save (save_checkpoint), of the checkpoint loaded (its record), else verl's
            fmt = self.save_format or optimizer_format(True, reshardable=self.reshardable_setting())
            metadata["distrib_optim_sharding_type"] = fmt
            if fmt == FULL_FORMAT:
                # gathered over gloo on data-parallel rank 0 in host memory (Megatron's memory-efficient
                # variant); the other gathers every data-parallel rank's state on each rank's device
                # (get_parameter_state_dp_zero), for Qwen3-30B-A3B's experts under EP8 about 44 GB a GPU
                metadata["distrib_optim_fully_reshardable_mem_efficient"] = True
        return metadata

    def reshardable_setting(self) -> bool:
        megatron = getattr(getattr(self.config, self.role, self.config), "megatron", None)
        return bool(getattr(megatron, "dist_ckpt_optim_fully_reshardable", False))

    def reshardable_at(self, global_step: int) -> bool:
        """Whether this save is in the format another layout loads: verl's switch, or the run's last step."""
        total = getattr(self.engine.optimizer_config, "total_training_steps", -1) or -1
        return self.reshardable_setting() or (total > 0 and int(global_step) >= total)

    def _finalize_save(self, *, local_path, hdfs_path, global_step, max_ckpt_to_keep, saved_any_dist_ckpt):
        # verl's writes its manifest, uploads, writes the tracker (async) and removes old checkpoints; here
        # the manifest only: the rest once the checkpoint is complete and in place (complete)
        self._write_checkpoint_manifest(local_path, global_step, saved_any_dist_ckpt)

    def _dispatch_finalize(self, async_requests, finalize_save_fn):
        writer = self.writer
        if writer is None or writer.pending is None:  # a save that is not in the background
            return super()._dispatch_finalize(async_requests, finalize_save_fn)
        writer.schedule(list(async_requests))  # megatron-core's persistent worker, not its module-level queue
        writer.pending.steps.append(finalize_save_fn)

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """verl's save into ``.<actor>.partial``, then :meth:`complete`: at once, or (``checkpoint.async_save``)
        as the last step of the background writes, which the run's last save waits for."""
        import torch.distributed as dist

        self.poll(blocking=True)  # the previous save is complete before this one starts
        final = Path(local_path).absolute()
        partial = partial_path(final)
        self.save_format = optimizer_format(self.use_distributed_optimizer,
                                            reshardable=self.reshardable_at(global_step))
        writer = self.writer if self.checkpoint_config.async_save else None
        try:
            if dist.get_rank() == 0:
                shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save of this step left
                partial.parent.mkdir(parents=True, exist_ok=True)
            dist.barrier()
            if writer is not None:
                writer.begin(str(final))
                self.engine.bridge.background = writer  # the HF shards: staged in host memory, written by its thread
            try:
                # verl removes old checkpoints before (ensure_checkpoint_capacity) and during its save, and uploads
                # to hdfs_path before the record exists: here both once the checkpoint is complete (complete)
                super().save_checkpoint(str(partial), None, global_step, None)
            finally:
                self.engine.bridge.background = None
            self.engine.on_checkpoint("save", global_step)
            done = functools.partial(self.complete, partial, final, hdfs_path, global_step, max_ckpt_to_keep,
                                     self.save_format, tracker=writer is not None)
            if writer is None:
                done()
            else:
                writer.pending.steps.append(done)
                if self.reshardable_at(global_step):  # the run's last save: nothing polls after it
                    writer.poll(blocking=True)
        finally:
            self.save_format = None

    def complete(self, partial: Path, final: Path, hdfs_path, global_step, max_ckpt_to_keep, sharding_type,
                 tracker: bool) -> None:
        """Collective, once every rank's writes are done: rank 0 writes the record (every file with its size),
        moves the folder into place, uploads it, and (a save in the background, for which verl's trainer does
        not) writes the tracker ``resume_mode=auto`` follows; then older checkpoints are removed."""
        import torch.distributed as dist

        from mcore_dapo import __version__, versions
        from mcore_dapo.io import output

        dist.barrier()
        if dist.get_rank() == 0:
            record = {"format": FORMAT, "global_step": int(global_step), **engine_record(self.engine, sharding_type),
                      "rng": "per_rank", "written_by": {"mcore_dapo": __version__,
                                                        **{k: versions.installed(k) for k in versions.SUPPORTED}},
                      "files": file_sizes(partial)}
            output.write_text_atomically(partial / RESUME_FILE, json.dumps(record, indent=1, sort_keys=True))
            output.finish(partial, final, overwrite=True)  # a complete checkpoint of the same step is replaced
            if hdfs_path is not None:  # as verl's _finalize_save: one recursive copy on rank 0
                from verl.utils import hdfs_io

                hdfs_io.makedirs(hdfs_path, exist_ok=True)
                hdfs_io.copy(src=str(final), dst=hdfs_path, dirs_exist_ok=True)
            if tracker:
                output.write_text_atomically(final.parent.parent / TRACKER, str(int(global_step)))
        dist.barrier()
        self.register_checkpoint(str(final), max_ckpt_to_keep)

    def poll(self, blocking: bool = False) -> bool:
        """Collective: finish the checkpoint whose writes ran in the background once every rank's are done
        (``blocking``: wait for them); True when none is left. The engine calls it at every training step."""
        return True if self.writer is None else self.writer.poll(blocking)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        engine = self.engine
        self.poll(blocking=True)
        here = engine_record(engine)
        record = check(local_path, here, load_optimizer=self.should_load_optimizer)
        contents = list(self.checkpoint_load_contents)
        # RNG states as written: per rank by this manager (its record says so), per (PP, TP) rank by verl's
        self.rng_per_rank = bool(record and record.get("rng") == "per_rank")
        self.save_format = ((record or {}).get("optimizer") or {}).get("sharding_type")
        if record is not None and "extra" in contents and (
                rng_layout(record["layout"]) != rng_layout(here["layout"])):
            # RNG states per rank (verl's: per (PP, TP) rank) are another layout's: the new layout keeps its own
            # seeds (Megatron's model_parallel_cuda_manual_seed per TP/EP rank; Qwen3 trains without dropout)
            import logging

            logging.getLogger(__name__).warning(
                "checkpoint %s: RNG states of %s not loaded under %s", local_path, layout_name(record["layout"]),
                layout_name(here["layout"]))
            self.checkpoint_load_contents = [c for c in contents if c != "extra"]
        try:
            out = super().load_checkpoint(local_path, hdfs_path, del_local_after_load)
        finally:
            self.checkpoint_load_contents = contents
            self.rng_per_rank = True
            self.save_format = None
        engine.on_checkpoint("load", step_of(Path(local_path).absolute()))
        return out

    @classmethod
    def rebuilt(cls, mgr, engine) -> McoreDapoCheckpointManager:
        """verl's manager ``mgr`` of ``engine`` as this class, built from the same arguments."""
        new = cls(**constructor_arguments(mgr))
        new.engine = engine  # the plugin's engine: its Bridge, its record, its HF weights I/O
        new.save_format = None  # the optimizer's format of the save or load under way (None: verl's choice)
        new.writer = background_writer() if new.checkpoint_config.async_save else None
        return new
