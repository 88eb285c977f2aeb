"""A checkpoint of verl's engine resumed under another layout, optimizer state included.

``torchrun --nproc-per-node 2 -m mcore_dapo_checks.reshard_resume save --hf-path DIR --work W``
``torchrun --nproc-per-node 2 -m mcore_dapo_checks.reshard_resume resume --hf-path DIR --work W --tp 2 --ep 2
--checkpoint W/last/global_step_4/actor``

Through verl's worker calls (``ActorRolloutRefWorker`` -> the plugin's ``McoreDapoEngine``, the distributed
optimizer, verl's LR scheduler restored from the checkpoint as the launch scripts set it), as
:mod:`mcore_dapo_checks.verl_engine` drives them. ``save`` (EP2): update 1 on batch A, ``save_checkpoint``
(step 1, in the format of a periodic save: no gather, the same layout resumes it; then the same state as the run's
last step ``W/last/global_step_4``, in the format another layout loads), update 2 on batch B: the uninterrupted
run, whose loss, grad norm and weights after update 2 (the export, bf16) are written to ``W``. ``--set`` passes
verl overrides (the checkpoint manager's ``async_save``). In the same processes two more workers load the checkpoint
under the same layout: one with everything (its update 2 must be the uninterrupted one exactly), one with
the weights and RNG alone (``checkpoint.load_contents=[model, extra]``: a fresh Adam, the control that
shows how far an update lands without the optimizer state). With ``--dist-start C``, a fourth worker starts
from the torch_dist checkpoint ``C`` with ``megatron.use_dist_checkpointing=True`` and saves the Megatron model
beside the HF weights (:func:`dist_model_save`). ``resume`` (another layout): load, update 2, compared with
the uninterrupted run's.

Checkpoint content (:func:`write_held_checksums`, :func:`checksums_differ`): the ranks write per-tensor crc32s of
what they hold at a save (the optimizer's fp32 main-parameter shards and Adam moments, from
:func:`mcore_dapo_checks.audit.held_state`; the engine's HF export), computed here from the tensors, not from
anything the checkpoint writer produced; the test reads the finished checkpoint's files itself (the optimizer's
dist checkpoint with torch's reader in one process, the HF shards with safetensors) and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import torch

BATCH_A, BATCH_B = 7, 8
LAST_STEP = 4  # verl_engine.overrides' optim.total_training_steps
_ENGINE: list = []
A = "actor_rollout_ref.actor"


def start(a, tp: int, pp: int, ep: int, extra: tuple[str, ...] = ()):
    from transformers import AutoConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from mcore_dapo_checks.verl_dapo import make_batch
    from mcore_dapo_checks.verl_engine import dist_world, overrides, rollout_batch
    from mcore_dapo.verl_plugin.main_dapo import compose
    from mcore_dapo.verl_plugin.overrides import rewrite

    args = overrides(a.hf_path, ep, tp, pp, world=dist_world(), device=a.device, dist_optimizer=True)
    # the launch scripts' setting: the LR scheduler's state comes from the checkpoint (verl's default: not)
    c = compose(rewrite([*args, f"{A}.optim.use_checkpoint_opt_param_scheduler=True",
                         f"{A}.optim.lr_warmup_steps=0", *(a.set or ()), *extra]))
    worker = ActorRolloutRefWorker(c.actor_rollout_ref, role="actor")
    worker.init_model()
    if not _ENGINE:
        _ENGINE.append(worker.actor.engine)  # the run's first: the one a killed save uses
    vocab = AutoConfig.from_pretrained(a.hf_path).vocab_size
    batches = {s: make_batch(vocab, seed=s) for s in (BATCH_A, BATCH_B)}
    return worker, worker.actor.engine, {s: (b, rollout_batch(b)) for s, b in batches.items()}


def engine_logp(worker, engine, batch, data) -> torch.Tensor:
    """verl's compute_log_prob on ``batch``: the response tokens' log-probs, ``[batch, response]``."""
    from verl.utils import tensordict_utils as tu

    from mcore_dapo_checks.verl_engine import _gather_logp, dispatch, engine_batch

    td = engine_batch(data)
    tu.assign_non_tensor(td, calculate_entropy=False, calculate_sum_pi_squared=False, compute_loss=False)
    mine = dispatch(td, engine.get_data_parallel_size(), engine.get_data_parallel_rank())
    return _gather_logp(engine, worker.compute_log_prob(mine), mine, len(data)) * batch["response_mask"]


def update(worker, engine, batch, data) -> dict:
    """verl's compute_log_prob then update_actor on ``batch`` (:func:`verl_engine._old_policy`'s old policy)."""
    from mcore_dapo_checks.verl_engine import _scalar, one_update

    lr = float(engine.optimizer.param_groups[0]["lr"])  # what this update applies (read before it)
    _, metrics = one_update(worker, engine, batch, data)
    return {"loss": float(_scalar(metrics["loss"])), "grad_norm": float(_scalar(metrics["grad_norm"])), "lr": lr,
            "scheduler_steps": int(engine.lr_scheduler.num_steps)}


def export(engine) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in engine.get_per_tensor_param()[0]}


def against(got: dict, want: dict, start: dict | None = None) -> dict:
    """Weights of an update against the uninterrupted run's: exact equality, the largest difference, and the
    share of elements more than one bf16 step apart (:func:`verl_dapo.beyond_one_step`)."""
    from mcore_dapo_checks.verl_dapo import beyond_one_step

    beyond = total = moved = 0
    worst = 0.0
    differ = []
    for n, w in want.items():
        g = got[n]
        if not torch.equal(g, w):
            differ.append(n)
        worst = max(worst, float((g.float() - w.float()).abs().max()))
        beyond += int(beyond_one_step(g, w.float()).sum())
        total += w.numel()
        if start is not None:
            moved += int((w != start[n]).sum())
    out = {"tensors": len(want), "differ": len(differ), "max_abs_diff": worst, "beyond_one_bf16_step": beyond / total}
    if start is not None:
        out["moved_by_update"] = moved / total
    return out


POINTS = ("background", "optimizer", "tracker")
ASYNC = f"{A}.checkpoint.async_save=True"


def write_tracker(root: Path, step: int) -> None:
    """What verl's trainer writes once a checkpoint's save returned (verl/trainer/ppo/v1/trainer_base.py
    ``_save_checkpoint``: ``latest_checkpointed_iteration.txt`` beside the ``global_step_N`` folders), unless the
    save runs in the background (then the checkpoint manager writes it once the checkpoint is complete)."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    dist.barrier()


def kill_all() -> None:
    """SIGKILL to this rank's process group: the rank and its helper processes (the background writer) at once,
    torchrun starting each rank in a session of its own; the launcher then stops the other ranks."""
    import os
    import signal

    os.killpg(os.getpgid(0), signal.SIGKILL)


def killed_save(engine, folder: Path, step: int, point: str) -> None:
    """``save_checkpoint`` of ``step`` killed at ``point``: in the background, once the save returned (its writes
    in flight or done, none finished: nothing moved into place); synchronously, once the optimizer's dist
    checkpoint is written (before the model's HF weights); in the background, once the checkpoint is complete and
    in place but before the tracker names it."""
    import torch.distributed as dist

    from mcore_dapo.io import output
    from mcore_dapo.verl_plugin import checkpoint

    mgr = engine.checkpoint_mananager
    if point == "optimizer":
        own = mgr._save_dist_checkpoint

        def save_then_die(path, state_dict):
            out = own(path, state_dict)
            if "optimizer" in state_dict:
                dist.barrier()
                if dist.get_rank() == 0:
                    kill_all()
            return out

        mgr._save_dist_checkpoint = save_then_die
    elif point == "tracker":
        write = output.write_text_atomically

        def die_before_the_tracker(path, text):
            if path.name == checkpoint.TRACKER:
                kill_all()
            write(path, text)

        output.write_text_atomically = die_before_the_tracker
    if point == "tracker":  # the save that completes: what it must hold, taken before it
        from mcore_dapo_checks.audit import held_state

        write_held_checksums(held_state(engine), export(engine), folder.parent.parent / "held" / f"step-{step}")
    engine.save_checkpoint(str(folder), global_step=step)
    if point == "tracker":
        engine.checkpoint_mananager.poll(blocking=True)
    dist.barrier()
    if dist.get_rank() == 0:
        kill_all()  # "background": the save returned, its writes run or wait to be finished by the next step


def restored_pieces(held: dict, loaded: dict) -> list[str]:
    """The pieces of :func:`mcore_dapo_checks.audit.held_state` that differ between what an engine held at
    a save and what another holds after loading it (same layout: the same shards in the same order);
    optimizer entries by index and key."""
    from mcore_dapo_checks.resume import _same

    out = [k for k in ("model", "lr_scheduler", "rng", "lr") if not _same(held[k], loaded[k])]
    if len(held["optimizer"]) != len(loaded["optimizer"]):
        return out + ["optimizer: entries"]
    for i, (h, l) in enumerate(zip(held["optimizer"], loaded["optimizer"])):
        out += [f"optimizer[{i}].{k}" for k in sorted(h.keys() | l.keys()) if k not in h or k not in l
                or not _same(h[k], l[k])]
    return out


OPTIMIZER_STATES = ("param", "exp_avg", "exp_avg_sq")  # the distributed optimizer's per-shard tensors


def crc32(t: torch.Tensor) -> str:
    """crc32 of a host tensor's bytes as stored (its dtype), computed here, not with the product's checksum."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def write_held_checksums(held: dict, hf: dict[str, torch.Tensor], folder: Path) -> None:
    """Collective. Each rank writes ``folder/rank<r>.json``: the crc32 and size of every optimizer tensor it holds
    (``held``: :func:`mcore_dapo_checks.audit.held_state`), by state; rank 0 adds the engine's HF export ``hf``
    (name -> crc32). Taken before the save: the reference a checkpoint's files are held against."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = {"optimizer": {k: sorted([e[k].numel(), crc32(e[k])] for e in held["optimizer"] if e[k].numel())
                          for k in OPTIMIZER_STATES},
            "hf": {n: crc32(t) for n, t in hf.items()} if rank == 0 else None}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.json").write_text(json.dumps(mine))
    dist.barrier()


def optimizer_chunks(actor: Path) -> list[tuple[str, list[int], torch.Tensor]]:
    """Every non-empty chunk of the optimizer's dist checkpoint (``optimizer/dist_ckpt``: key, offsets, the
    values), read with torch's reader in this process."""
    import warnings

    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(actor / "optimizer" / "dist_ckpt"))
    meta = reader.read_metadata().state_dict_metadata
    full = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.items()
            if isinstance(v, TensorStorageMetadata)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
        load(full, storage_reader=reader, no_dist=True)
    out = []
    for key, t in full.items():
        for c in meta[key].chunks:
            piece = t[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes))]
            if piece.numel():
                out.append((key, list(c.offsets), piece))
    return out


def checkpoint_checksums(actor: Path) -> dict:
    """A checkpoint as its files hold it, read here in one process (no Megatron, no process group): every chunk of
    the optimizer's dist checkpoint (``optimizer/dist_ckpt``, torch's reader; one chunk per tensor a rank wrote)
    with its key, offsets, size and crc32; every HF tensor's crc32 (``model/huggingface``, safetensors)."""
    from safetensors.torch import load_file

    chunks = [{"key": key, "offsets": offsets, "numel": piece.numel(), "crc32": crc32(piece)}
              for key, offsets, piece in optimizer_chunks(actor)]
    hf = {}
    for f in sorted((actor / "model" / "huggingface").glob("*.safetensors")):
        hf.update({n: crc32(t) for n, t in load_file(str(f)).items()})
    return {"optimizer": chunks, "hf": hf}


def checksums_differ(held_dir: Path, actor: Path) -> dict:
    """The checkpoint ``actor`` against the checksums the ranks wrote at its save (:func:`write_held_checksums`):
    each HF tensor by name; the optimizer's tensors by state (its key's last part) as multisets of (size, crc32),
    every rank's shards together against the chunks on disk (the chunk a shard went to is Megatron's layout, not
    asserted here). ``differ`` names each HF tensor that differs and each held shard without a twin on disk.
    Chunks on disk without a held twin are counted apart (``unheld_chunks``, ``unheld_elements``): Megatron's
    dp_reshardable format also writes the padding of its gradient buckets, uninitialised memory that no rank holds
    as optimizer state (8 chunks of 48 elements per state in the EP2 checkpoint)."""
    ranks = [json.loads(p.read_text()) for p in sorted(held_dir.glob("rank*.json"))]
    disk = checkpoint_checksums(actor)
    held_hf = ranks[0]["hf"]
    differ = [f"hf {n}" for n in sorted(held_hf.keys() | disk["hf"].keys()) if held_hf.get(n) != disk["hf"].get(n)]
    counts, unheld, unheld_elements = {}, {}, {}
    for state in OPTIMIZER_STATES:
        want = Counter(tuple(x) for r in ranks for x in r["optimizer"][state])
        got = Counter((c["numel"], c["crc32"]) for c in disk["optimizer"] if c["key"].rsplit(".", 1)[-1] == state)
        counts[state] = sum(want.values())
        differ += [f"held {state} shard of {n} elements (crc32 {h}) not on disk" for n, h in sorted(want - got)]
        unheld[state] = sum((got - want).values())
        unheld_elements[state] = sum(n * k for (n, _), k in (got - want).items())
    other = sorted({c["key"] for c in disk["optimizer"] if c["key"].rsplit(".", 1)[-1] not in OPTIMIZER_STATES})
    differ += [f"disk {k}: not an optimizer state compared" for k in other]
    return {"ranks": len(ranks), "hf_tensors": len(held_hf), "optimizer_shards": counts,
            "optimizer_elements": {s: sum(x[0] for r in ranks for x in r["optimizer"][s]) for s in OPTIMIZER_STATES},
            "unheld_chunks": unheld, "unheld_elements": unheld_elements, "differ": differ}


def _all_ranks(items: list[str]) -> list[str]:
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, items)
    return sorted({x for r in every for x in r})


def save_run(a) -> dict:
    import torch.distributed as dist


    work, folder = Path(a.work), Path(a.work) / "global_step_1" / "actor"
    worker, engine, batches = start(a, a.tp, a.pp, a.ep)
    first = update(worker, engine, *batches[BATCH_A])
    t = time.perf_counter()
    # trainer.default_hdfs_dir's copy (verl's hdfs_io copies local paths too)
    engine.save_checkpoint(str(folder), hdfs_path=str(work / "remote" / "global_step_1" / "actor"), global_step=1)
    save_s = time.perf_counter() - t
    engine.checkpoint_mananager.poll(blocking=True)  # a background save: complete (and the tracker written) here
    if not engine.checkpoint_mananager.checkpoint_config.async_save:
        write_tracker(work, 1)
    # the same state saved as the run's last step (the overrides' total_training_steps): in the format another
    # layout loads, complete when the save returns
    engine.save_checkpoint(str(work / "last" / f"global_step_{LAST_STEP}" / "actor"), global_step=LAST_STEP)
    at_save = export(engine)
    logp = engine_logp(worker, engine, *batches[BATCH_B])  # the engine's log-probs at the save
    from mcore_dapo_checks.audit import held_state

    held = held_state(engine)
    write_held_checksums(held, at_save, work / "held" / "step-1")  # what global_step_1 must hold
    second = update(worker, engine, *batches[BATCH_B])
    want = export(engine)
    rank = dist.get_rank()
    if rank == 0:
        torch.save({"update": second, "weights": want, "at_save": at_save, "engine_logp": logp,
                    "batch": batches[BATCH_B][0]}, work / "uninterrupted.pt")
    out = {"layout": engine.mcore_bridge.layout.describe(), "first": first, "uninterrupted": second,
           "save_seconds": round(save_s, 2), "hf_save": engine.bridge.last_save}
    # the same layout: everything loaded, then the weights and RNG alone (a fresh optimizer: the control)
    for name, extra in (("same_layout", ()), ("without_optimizer", (f"{A}.checkpoint.load_contents=[model,extra]",))):
        w2, e2, b2 = start(a, a.tp, a.pp, a.ep, extra)
        e2.load_checkpoint(str(folder), del_local_after_load=False)
        loaded = export(e2)
        restored = restored_pieces(held, held_state(e2))
        r = update(w2, e2, *b2[BATCH_B])
        out[name] = {"update": r, "loaded_vs_saved": against(loaded, at_save), "restored_differ": _all_ranks(restored),
                     "weights": against(export(e2), want, at_save)}
    if a.dist_start:  # in the same processes: the engine started from a torch_dist checkpoint
        out["dist_model"] = dist_model_save(a)
    return out if rank == 0 else None


def resume_run(a) -> dict:
    import torch.distributed as dist

    work = Path(a.work)
    folder = Path(a.checkpoint) if a.checkpoint else work / "global_step_1" / "actor"
    worker, engine, batches = start(a, a.tp, a.pp, a.ep)
    t = time.perf_counter()
    engine.load_checkpoint(str(folder), del_local_after_load=False)
    load_s = time.perf_counter() - t
    loaded = export(engine)
    r = update(worker, engine, *batches[BATCH_B])
    got = export(engine)
    if dist.get_rank() != 0:
        return None
    ref = torch.load(work / "uninterrupted.pt", weights_only=False)
    return {"layout": engine.mcore_bridge.layout.describe(), "update": r, "uninterrupted": ref["update"],
            "loaded_vs_saved": against(loaded, ref["at_save"]), "weights": against(got, ref["weights"], ref["at_save"]),
            "load_seconds": round(load_s, 2)}


class RssSampler:
    """This process's resident memory sampled every few milliseconds while the block runs (its peak, in MiB)."""

    def __init__(self, every: float = 0.005):
        import threading

        self.every, self.peak, self._stop = every, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now_mb() -> float:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now_mb())
            self._stop.wait(self.every)

    def __enter__(self):
        self.before = self.now_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now_mb())


def disk_bound(folder: Path, nbytes: int) -> float:
    """Collective: every rank writes ``nbytes`` (its share of a checkpoint's bytes) into a file of its own in
    ``folder`` at once, in 64 MiB writes, and syncs it; the seconds until the last rank is done."""
    import os

    import torch.distributed as dist

    block = os.urandom(1 << 20) * 64
    path = folder / f"disk-bound-{dist.get_rank()}.bin"
    dist.barrier()
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[:min(left, len(block))])
        f.flush()
        os.fsync(f.fileno())
    mine = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    path.unlink()
    return float(mine)


def bench_run(a) -> dict:
    """One checkpoint of a trained engine (one update: the optimizer's state exists), saved as the engine's
    settings say (``--set actor_rollout_ref.actor.checkpoint.async_save=True``: in the background): the seconds
    training is blocked (``save_checkpoint`` returning), the seconds until the checkpoint is complete (in place,
    its record written), the seconds every rank takes to write its share of the same bytes with plain writes
    (the disk bound, in the same run), then ``load_checkpoint`` of it into the same engine timed, with each
    rank's resident memory sampled during the load against its own share of the checkpoint's bytes."""
    import shutil

    import torch.distributed as dist

    from mcore_dapo.verl_plugin import checkpoint

    work = Path(a.work)
    worker, engine, batches = start(a, a.tp, a.pp, a.ep)
    update(worker, engine, *batches[BATCH_A])
    params = sum(p.numel() for c in engine.module for p in c.parameters())
    folder = work / "global_step_1" / "actor"
    mgr = engine.checkpoint_mananager
    dist.barrier()
    t = time.perf_counter()
    engine.save_checkpoint(str(folder), global_step=1)
    blocked = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(blocked, op=dist.ReduceOp.MAX)
    while not mgr.poll(blocking=False):
        time.sleep(0.02)  # training would go on here; the poll is what each training step runs
    persisted = time.perf_counter() - t
    record = json.loads((folder / checkpoint.RESUME_FILE).read_text())
    total = sum(record["files"].values())
    # this rank's share: the files it wrote (dist-checkpoint files carry the writing rank's global rank in their
    # name, __<rank>_<n>.distcp; HF part files were numbered apart) are not told apart here, so the even share
    disk_s = disk_bound(work, total // dist.get_world_size())
    own = {"optimizer": 0, "model": 0}
    for name, size in record["files"].items():
        part = name.split("/")[0]
        if part in own:
            own[part] += size
    dist.barrier()
    with RssSampler() as rss:
        t = time.perf_counter()
        engine.load_checkpoint(str(folder), del_local_after_load=False)
        dist.barrier()
        load_s = time.perf_counter() - t
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {"params": params, "load_rss_before_mb": round(rss.before),
                                   "load_rss_peak_mb": round(rss.peak)})
    if dist.get_rank() != 0:
        return None
    parts: dict[str, int] = {}
    for name, size in record["files"].items():
        parts[name.split("/")[0]] = parts.get(name.split("/")[0], 0) + size
    shutil.rmtree(work / "global_step_1", ignore_errors=True)
    world = len(every)
    return {"layout": engine.mcore_bridge.layout.describe(), "world_size": world,
            "async_save": bool(mgr.checkpoint_config.async_save),
            "optimizer_format": record["optimizer"]["sharding_type"],
            "blocked_s": round(float(blocked), 3), "persisted_s": round(persisted, 3), "disk_bound_s": round(disk_s, 3),
            "load_s": round(load_s, 3), "bytes": parts, "total_bytes": total,
            "hf_writer_ranks": engine.bridge.last_save.get("writer_ranks"),
            "rank_params": [e["params"] for e in every],
            "optimizer_and_model_bytes_per_rank": round((own["optimizer"] + own["model"]) / world),
            "load_rss_before_mb": [e["load_rss_before_mb"] for e in every],
            "load_rss_peak_mb": [e["load_rss_peak_mb"] for e in every]}


def dist_model_save(a) -> dict:
    """An engine with ``megatron.use_dist_checkpointing=True``, its weights from the torch_dist checkpoint
    ``--dist-start`` (as ``mcore-convert hf2mcore`` writes it): one update, then a save with
    ``save_contents=[model, hf_model, optimizer, extra]``, which writes the Megatron model (``model/dist_ckpt``)
    beside its HF weights (``model/huggingface``) under ``W/dist-model``; the engine's weights as loaded and
    at the save are written there too."""
    import torch.distributed as dist


    work = Path(a.work) / "dist-model"
    folder = work / "global_step_1" / "actor"
    worker, engine, batches = start(a, a.tp, a.pp, a.ep, (
        f"{A}.megatron.use_dist_checkpointing=True", f"{A}.megatron.dist_checkpointing_path={a.dist_start}",
        f"{A}.checkpoint.save_contents=[model,hf_model,optimizer,extra]"))
    loaded = export(engine)
    update(worker, engine, *batches[BATCH_A])
    engine.save_checkpoint(str(folder), global_step=1)
    engine.checkpoint_mananager.poll(blocking=True)
    at_save = export(engine)
    if dist.get_rank() == 0:
        torch.save({"loaded": loaded, "at_save": at_save}, work / "weights.pt")
    return {"layout": engine.mcore_bridge.layout.describe(),
            "files": sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())}


def bad_run(a) -> dict:
    """A resume that cannot be: the one line the engine's load gives (the checkpoint is left as it is)."""
    from mcore_dapo.errors import UserError

    worker, engine, _ = start(a, a.tp, a.pp, a.ep)
    try:
        engine.load_checkpoint(str(Path(a.checkpoint)), del_local_after_load=False)
    except UserError as e:
        return {"user_error": str(e)}
    return {"loaded": True}


def launch(mode: str, hf_path, work, *, tp: int = 1, pp: int = 1, ep: int = 2, kill_in_save: str | None = None,
           nproc: int = 2, timeout: float = 600, extra: tuple[str, ...] = ()) -> dict:
    """Run a mode under torchrun (in a session of its own: a kill takes every process of it); rank 0's result,
    also when the launch was killed after writing it."""
    import json
    import os
    import tempfile

    from mcore_dapo.bridge.layout import Layout
    from mcore_dapo.runtime.launch import LaunchError, run_torchrun

    with tempfile.TemporaryDirectory(prefix="mcore-dapo-reshard-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "output.log"
        argv = ["-m", "mcore_dapo_checks.reshard_resume", mode, "--hf-path", str(hf_path), "--work", str(work),
                *Layout(tp=tp, pp=pp, ep=ep).to_argv(), "--out", str(out),
                *(["--kill-in-save", kill_in_save] if kill_in_save else []), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        rc, _, text = run_torchrun(nproc, argv, env, log, timeout, out)
        if not out.is_file() or (rc != 0 and not kill_in_save):
            tail = "\n".join(text.splitlines()[-40:])
            raise LaunchError(f"reshard_resume {mode} {'timed out' if rc is None else f'exit code {rc}'}:\n{tail}")
        result = json.loads(out.read_text())
    return {**result, "returncode": rc}


def main(argv=None) -> int:
    from mcore_dapo.bridge.layout import Layout

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.reshard_resume")
    ap.add_argument("mode", choices=["save", "resume", "bad", "bench"])
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--checkpoint", default=None, help="resume, bad: the checkpoint to load (resume: default "
                    "W/global_step_1/actor)")
    ap.add_argument("--dist-start", default=None,
                    help="save: also run an engine with use_dist_checkpointing=True from this torch_dist checkpoint")
    Layout.add_args(ap, ("tp", "pp", "ep"), ep=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kill-in-save", choices=POINTS, default=None,
                    help="after the result is written: save step 2 and SIGKILL rank 0's processes at that point")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a verl override for every engine of the launch")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import torch.distributed as dist

    from mcore_dapo.runtime.launch import finish_worker

    run = {"save": save_run, "resume": resume_run, "bad": bad_run, "bench": bench_run}[a.mode]
    if not a.kill_in_save:
        return finish_worker(run(a), a.out)
    result, engine = run(a), _ENGINE[0]
    if dist.get_rank() == 0:
        Path(a.out).write_text(json.dumps(result))
    killed_save(engine, Path(a.work) / "global_step_2" / "actor", 2, a.kill_in_save)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
