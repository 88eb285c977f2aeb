"""Checkpoints of verl's trainer on the plugin's engine, before Ray and at a load: the record a checkpoint
carries (:data:`RESUME_FILE`), the distributed optimizer's formats (:func:`optimizer_format`), the one-line
checks before a load (:func:`check`, which names the previous complete checkpoint) and of what a resume would
load (:func:`check_resume`, in ``main_dapo`` before Ray). No verl, no Megatron at import.

The save itself (atomic, optionally in the background, every rank writing its own shards) is
:class:`~mcore_dapo.verl_plugin.checkpoint_manager.McoreDapoCheckpointManager`'s. What verl 0.9.1's own
manager and trainer do, and why the plugin replaces it: docs/VERL_PLUGIN.md, "Checkpoints and resume".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mcore_dapo.errors import UserError

RESUME_FILE = "mcore_dapo_resume.json"
RNG_KEY = "rng_state_per_rank"
FORMAT = "mcore-dapo/verl-checkpoint/1"
# megatron-core's DistributedOptimizer.sharded_state_dict (megatron/core/optimizer/distrib_optimizer.py). 0.16.1:
# 'dp_reshardable' (its default, and verl's on megatron-core >= 0.14) writes each rank's own bucket shards with no
# communication, and loads under another data-parallel size only; 'fully_reshardable' loads under another
# TP/PP/EP/DP layout, and gathers each data-parallel group's state on one rank (over gloo into host memory with
# distrib_optim_fully_reshardable_mem_efficient, the variant taken here; the other gathers it on every rank's
# device); 'fully_sharded_model_space' no longer saves there (its ShardedTensors carry a flattened_range, which
# megatron/core/dist_checkpointing/mapping.py refuses: "ShardedTensor.flattened_range is not supported."), and
# 'fsdp_dtensor' is Megatron-FSDP's. 0.12.1: 'fully_sharded_model_space' (verl's choice below 0.14) writes each
# rank's own flattened ranges with no gather, and loads under another TP/PP/EP/DP layout.
DP_FORMAT, FULL_FORMAT, OLD_LINE_FORMAT = "dp_reshardable", "fully_reshardable", "fully_sharded_model_space"
NEW_LINE_FORMAT = DP_FORMAT  # what a periodic save writes on megatron-core >= 0.14
RESHARDABLE = frozenset({FULL_FORMAT, OLD_LINE_FORMAT})  # the formats another model-parallel layout loads
# verl's switch (verl/trainer/config/engine/megatron.yaml): every save in the format another layout loads
RESHARDABLE_KEY = "actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable"
TRACKER = "latest_checkpointed_iteration.txt"
# the model fields a checkpoint must share with the model it is loaded into
MODEL_FIELDS = ("model_type", "vocab_size", "padded_vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "intermediate_size", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "tie_word_embeddings", "mlp_only_layers")


def partial_path(final: Path) -> Path:
    return final.parent / f".{final.name}.partial"


def describe_model(cfg, layout) -> dict:
    from mcore_dapo.bridge.megatron_config import padded_vocab_size

    d = cfg.summary()
    d["padded_vocab_size"] = padded_vocab_size(cfg.vocab_size, layout.tp)
    return {k: d[k] for k in MODEL_FIELDS}


def optimizer_format(use_distributed_optimizer: bool, megatron_version: str | None = None,
                     reshardable: bool = False) -> str | None:
    """The format the distributed optimizer is saved in: with no gather (``dp_reshardable`` from megatron-core
    0.14, ``fully_sharded_model_space`` before), or, where ``reshardable`` on megatron-core >= 0.14,
    ``fully_reshardable`` (another TP/PP/EP layout loads it; gathered per data-parallel group)."""
    if not use_distributed_optimizer:
        return None
    if not _new_line(megatron_version):
        return OLD_LINE_FORMAT
    return FULL_FORMAT if reshardable else DP_FORMAT


def _new_line(megatron_version: str | None = None) -> bool:
    from packaging.version import Version

    from mcore_dapo import versions

    return Version(megatron_version or versions.installed("megatron-core")) >= Version("0.14")


def readable_formats(megatron_version: str | None = None) -> set[str]:
    """The distributed optimizer's formats a load of this manager reads: those this megatron-core writes. Its load
    builds the optimizer's sharded state dict with the checkpoint's format (its record says which), and across
    the lines the other's format does not load at all: megatron-core 0.12.1 has neither ``dp_reshardable`` nor
    ``fully_reshardable``; 0.16.1's ``fully_sharded_model_space`` builds ShardedTensors with a
    ``flattened_range``, which its ``ShardedTensor.validate_metadata_integrity`` refuses
    (megatron/core/dist_checkpointing/mapping.py), on a load as on a save."""
    return {DP_FORMAT, FULL_FORMAT} if _new_line(megatron_version) else {OLD_LINE_FORMAT}


def engine_record(engine, sharding_type: str | None = None) -> dict:
    """What a checkpoint of this engine records of it (and a load compares); ``sharding_type``: the format its
    distributed optimizer is saved in (default: a periodic save's)."""
    import torch.distributed as dist

    layout = engine.mcore_bridge.layout
    distributed = bool(engine.engine_config.use_distributed_optimizer)
    return {"model": describe_model(engine.mcore_bridge.cfg, layout),
            "layout": {**layout.as_dict(), "world_size": dist.get_world_size()},
            "optimizer": {"distributed": distributed,
                          "sharding_type": sharding_type if distributed and sharding_type else
                          optimizer_format(distributed)},
            "dtype": str(engine.param_dtype).replace("torch.", "")}


def file_sizes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def read_record(folder: Path) -> dict | None:
    p = folder / RESUME_FILE
    if not p.is_file():
        return None
    try:
        record = json.loads(p.read_text())
    except (OSError, ValueError):
        raise UserError(f"checkpoint file {p} cannot be read as JSON: damaged{_offer(folder)}") from None
    if record.get("format") != FORMAT:
        raise UserError(f"{p} has format {record.get('format')!r}: accepted is {FORMAT!r}")
    return record


def step_of(folder: Path) -> int | None:
    name = folder.parent.name
    return int(name.split("global_step_")[-1]) if name.startswith("global_step_") and name[12:].isdigit() else None


def problem(folder: Path) -> str | None:
    """Why ``folder`` (a ``global_step_N/actor``) is not a complete checkpoint, in a few words; None if it is."""
    folder = Path(folder)
    if not folder.is_dir():
        if partial_path(folder).is_dir():
            return f"checkpoint {folder} is incomplete (its save was interrupted: {partial_path(folder)} is what it wrote)"
        return f"checkpoint {folder} does not exist"
    record = read_record(folder)
    if record is None:
        if not (folder / "ckpt_contents.json").is_file():
            return f"checkpoint {folder} is incomplete (no ckpt_contents.json, which verl writes last)"
        return None  # verl's own (or an earlier plugin's) checkpoint: verl's manifest says it is complete
    for name, size in record["files"].items():
        p = folder / name
        if not p.is_file():
            return f"checkpoint file {p} is missing"
        if p.stat().st_size != size:
            return f"checkpoint file {p} is {p.stat().st_size} bytes, {size} were written: truncated or damaged"
    for index in folder.rglob("*.safetensors.index.json"):  # the HF weights' index names every shard
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return f"checkpoint file {index} cannot be read as an HF index: damaged"
        for shard in sorted(shards):
            if not (index.parent / shard).is_file():
                return f"checkpoint file {index} names {shard}, which is missing"
    return None


def previous_complete(folder: Path) -> Path | None:
    """The newest complete ``global_step_M/<role>`` beside ``folder`` (a ``global_step_N/<role>``) with M < N."""
    folder = Path(folder).absolute()
    return newest_complete(folder.parent.parent, folder.name, below=step_of(folder))


def newest_complete(root: Path, role: str = "actor", below: int | None = None,
                    reshardable: bool = False) -> Path | None:
    """The newest complete checkpoint under ``root`` (below step ``below``; ``reshardable``: whose optimizer
    state another layout loads, by its record)."""
    found = []
    for d in Path(root).glob("global_step_*"):
        m = d.name[len("global_step_"):]
        if m.isdigit() and (below is None or int(m) < below):
            found.append((int(m), d / role))
    for _, cand in sorted(found, reverse=True):
        try:
            if problem(cand) is not None:
                continue
            if reshardable and ((read_record(cand) or {}).get("optimizer") or {}).get("sharding_type") \
                    not in RESHARDABLE:
                continue
            return cand
        except UserError:
            continue
    return None


def _offer(folder: Path | None = None, prev: Path | None = None) -> str:
    prev = previous_complete(folder) if folder is not None else prev
    if prev is None:
        return "; no earlier complete checkpoint is there (trainer.resume_mode=disable starts afresh)"
    return (f"; the previous complete checkpoint is {prev.parent}: trainer.resume_mode=resume_path "
            f"trainer.resume_from_path={prev.parent}")


def check(folder, here: dict, load_optimizer: bool = True) -> dict | None:
    """Refuse (one line) what cannot be resumed into the engine described by ``here`` (:func:`engine_record`):
    incomplete or truncated, another model, or optimizer state in a format this layout cannot load."""
    folder = Path(folder).absolute()
    why = problem(folder)
    if why:
        raise UserError(why + _offer(folder))
    record = read_record(folder)
    if record is None:
        return None
    diff = [f"{k} {record['model'].get(k)!r} there, {v!r} here" for k, v in here["model"].items()
            if record["model"].get(k) != v]
    if diff:
        raise UserError(f"checkpoint {folder} is of another model: {', '.join(diff)}")
    fmt = (record.get("optimizer") or {}).get("sharding_type")
    if load_optimizer and fmt and fmt not in readable_formats():
        from mcore_dapo import versions

        here_v, writer = versions.installed("megatron-core"), (record.get("written_by") or {}).get("megatron-core")
        other_line = writer is not None and writer.split(".")[:2] != here_v.split(".")[:2]
        raise UserError(f"checkpoint {folder} holds the distributed optimizer in Megatron's {fmt} format, which "
                        f"megatron-core {here_v} does not read (written by megatron-core {writer}; accepted here: "
                        f"{', '.join(sorted(readable_formats()))}): {'resume on that line, or ' if other_line else ''}"
                        "load the weights alone (actor_rollout_ref.actor.checkpoint.load_contents=[model])")
    there, now = record["layout"], here["layout"]
    if load_optimizer and (record.get("optimizer") or {}).get("distributed") and \
            (there.get("ep", 1) > 1) != (now.get("ep", 1) > 1):
        # megatron/core/transformer/moe/experts.py marks expert parameters allreduce=False only when
        # expert_model_parallel_size > 1, and get_megatron_optimizer (megatron/core/optimizer/__init__.py) builds
        # their own optimizer then: the checkpoint holds one optimizer's state, or two, which the other cannot load
        raise UserError(
            f"checkpoint {folder} was written under {layout_name(there)}, this run is {layout_name(now)}: with EP > 1 Megatron "
            "keeps the experts' optimizer apart from the others, with EP = 1 not, and the optimizer state of one does "
            f"not load into the other; accepted here: EP {'> 1' if there.get('ep', 1) > 1 else '= 1'}, or the weights "
            "alone (actor_rollout_ref.actor.checkpoint.load_contents=[model])")
    if load_optimizer and fmt and fmt not in RESHARDABLE and _model_parallel(there) != _model_parallel(now):
        # megatron-core's load_parameter_state_from_dp_reshardable asserts the same buckets as at the save
        other = newest_complete(folder.parent.parent, folder.name, reshardable=True)
        offer = (f"resume from {other.parent}, whose optimizer state is in a format another layout loads"
                 if other is not None else "no checkpoint beside it is in a format another layout loads")
        raise UserError(
            f"checkpoint {folder} holds the distributed optimizer in Megatron's {fmt} format, which loads under "
            f"the layout it was written under only (another data-parallel size aside): {layout_name(there)}, this run "
            f"is {layout_name(now)}; {offer}; accepted: that layout, a checkpoint saved at a run's last step or with "
            f"{RESHARDABLE_KEY}=True, or the weights alone (actor_rollout_ref.actor.checkpoint.load_contents=[model])")
    # the format read (above) is reshardable, or the layout is the same but for the data-parallel size
    if load_optimizer and bool((record.get("optimizer") or {}).get("distributed")) != bool(here["optimizer"]["distributed"]):
        # under the same layout too: the two optimizers' states are laid out differently
        raise UserError(f"checkpoint {folder} was written with use_distributed_optimizer="
                        f"{(record.get('optimizer') or {}).get('distributed')}, this run has "
                        f"{here['optimizer']['distributed']}: accepted is the checkpoint's setting, or the weights "
                        "alone (actor_rollout_ref.actor.checkpoint.load_contents=[model])")
    return record


def _model_parallel(d: dict) -> tuple:
    return tuple(d.get(k) or (None if k == "vpp" else 1) for k in ("tp", "pp", "ep", "etp", "cp", "vpp"))


def rng_layout(d: dict) -> tuple:
    """What RNG states per rank (this manager's) or per (PP, TP) rank (verl's) need to load as saved."""
    return tuple(d.get(k) for k in ("tp", "pp", "ep", "etp", "cp", "vpp", "world_size"))


def layout_name(d: dict) -> str:
    s = f"TP{d.get('tp')} PP{d.get('pp')} EP{d.get('ep')} ETP{d.get('etp')}"
    if (d.get("cp") or 1) > 1:
        s += f" CP{d['cp']}"
    if d.get("vpp"):
        s += f" VPP{d['vpp']}"
    return f"{s} on {d.get('world_size')} ranks"


def check_resume(config) -> None:
    """Before Ray starts (``main_dapo``): the checkpoint ``trainer.resume_mode`` would load, checked against
    the configured model and layout (one line on a mismatch; nothing runs)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    from mcore_dapo.bridge import Layout
    from mcore_dapo.verl_plugin.config_checks import check_architecture

    t = config.trainer
    mode = str(t.get("resume_mode", "disable"))
    if mode == "auto":
        root = t.default_local_dir
        root = root if os.path.isabs(root) else os.path.join(os.getcwd(), root)
        tracker = Path(root) / "latest_checkpointed_iteration.txt"
        if tracker.is_file():
            text = tracker.read_text().strip()
            if not text.isdigit():
                raise UserError(f"checkpoint tracker {tracker} reads {text!r}, not a step number: damaged"
                                + _offer(prev=newest_complete(Path(root))))
        folder = find_latest_ckpt_path(root)
        if folder is None:
            return
    elif mode == "resume_path":
        folder = t.resume_from_path
        folder = folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
    else:
        return
    actor = config.actor_rollout_ref.actor
    layout = Layout.from_megatron(actor.megatron)
    cfg = check_architecture(config.actor_rollout_ref.model.path)
    world = int(t.nnodes) * int(t.n_gpus_per_node)
    here = {"model": describe_model(cfg, layout), "layout": {**layout.as_dict(), "world_size": world},
            "optimizer": {"distributed": bool(actor.megatron.use_distributed_optimizer),
                          "sharding_type": optimizer_format(bool(actor.megatron.use_distributed_optimizer))}}
    load = list(actor.get("checkpoint", {}).get("load_contents", ["model", "optimizer", "extra"]))
    check(Path(folder) / "actor", here, load_optimizer="optimizer" in load)
