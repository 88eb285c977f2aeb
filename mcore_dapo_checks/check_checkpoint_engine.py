"""The gloo checkpoint engine (:mod:`mcore_dapo.verl_cpu.checkpoint_engine`) between processes, as verl's
``CheckpointEngineManager`` drives it (``prepare``, ``build_topology``, ``init_process_group``, ``send_weights`` on
every trainer rank, ``receive_weights`` on the rollout's, ``finalize``), without Ray or a model: two trainer ranks
(a gloo default group of their own, as Megatron's) and one rollout rank, each a process.

``python -m mcore_dapo_checks.check_checkpoint_engine OUT`` runs two syncs in the same processes, each with its
own process group as verl rebuilds one per sync, and writes ``OUT/result.json``: per sync, what the receiver got
(names, and whether every tensor equals the sender's bit for bit), whether its consumer committed (it commits only
after the stream's end, as the hf_cpu server does), and each process's error line. Each sync carries a mutation:
``order`` (step 3), the second trainer rank yields the tensors in another order; ``corrupt`` (step 4), one byte of
one bucket flipped on the rollout's side after the broadcast.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

MODULE = "mcore_dapo_checks.check_checkpoint_engine"
BUCKET = 4096  # bytes: several buckets, and one tensor larger than a bucket (split in chunks)


def weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [("model.embed_tokens.weight", torch.randn(40, 16, generator=g).to(torch.bfloat16)),
            ("model.layers.0.mlp.gate.weight", torch.randn(8, 16, generator=g)),
            ("model.layers.0.mlp.experts.0.up_proj.weight", torch.randn(64, 32, generator=g).to(torch.bfloat16)),
            ("model.norm.weight", torch.ones(16)),
            ("lm_head.weight", torch.randn(40, 16, generator=g).to(torch.bfloat16))]


def _engine():
    from mcore_dapo.verl_cpu.checkpoint_engine import GlooCheckpointEngine

    return GlooCheckpointEngine


SYNCS = {3: "order", 4: "corrupt"}  # global step -> the mutation of that sync


def _last_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]


def trainer(out: Path, rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{out / 'trainer.store'}")
    errors = {}
    for step, mutation in SYNCS.items():
        engine = _engine()(bucket_size=BUCKET, is_master=rank == 0)
        meta = engine.prepare()
        if rank == 0:
            (out / f"master-{step}.json").write_text(json.dumps({"host": meta.host, "port": meta.port}))
        else:
            meta = _master(out, step)
        kwargs, _ = type(engine).build_topology(2, 1, [meta, None, None])
        engine.init_process_group(**{k: v[rank] for k, v in kwargs.items()})
        stream = weights()
        if mutation == "order" and rank == 1:
            stream = stream[1:] + stream[:1]
        try:
            asyncio.run(engine.send_weights(iter(stream), global_steps=step))
            errors[step] = None
        except RuntimeError as e:
            errors[step] = _last_line(e)
        engine.finalize()
    (out / f"trainer{rank}.json").write_text(json.dumps(errors))


def _master(out: Path, step: int):
    from mcore_dapo.verl_cpu.checkpoint_engine import MasterMetadata

    for _ in range(600):
        f = out / f"master-{step}.json"
        if f.is_file() and f.read_text():
            return MasterMetadata(**json.loads(f.read_text()))
        time.sleep(0.1)
    raise TimeoutError("no master metadata")


def rollout(out: Path) -> None:
    results = {}
    for step, mutation in SYNCS.items():
        engine = _engine()(bucket_size=BUCKET)
        engine.prepare()
        meta = _master(out, step)
        _, kwargs = type(engine).build_topology(2, 1, [meta, None, None])
        engine.init_process_group(**{k: v[0] for k, v in kwargs.items()})
        if mutation == "corrupt":
            broadcast = engine._broadcast
            count = {"n": 0}

            def flip(t):  # the second bucket arrives with one byte changed
                broadcast(t)
                if t.numel() == BUCKET:
                    count["n"] += 1
                    if count["n"] == 2:
                        t[17] ^= 0xFF
            engine._broadcast = flip
        got, committed, error = [], False, None

        async def consume():  # as the hf_cpu server: staged, committed after the stream's end
            nonlocal committed
            async for name, t in engine.receive_weights(global_steps=step):
                got.append((name, t.clone()))
            committed = True

        try:
            asyncio.run(consume())
        except RuntimeError as e:
            error = _last_line(e)
        sent = dict(weights())
        results[step] = {
            "names": [n for n, _ in got], "committed": committed, "error": error,
            "equal": all(t.dtype == sent[n].dtype and torch.equal(t.view(torch.uint8), sent[n].view(torch.uint8))
                         for n, t in got)}
        engine.finalize()
    (out / "received.json").write_text(json.dumps(results))


def run(out: Path, timeout: float = 400) -> dict:
    """Both syncs in one launch: ``{"syncs": {step: {"mutation", "received", "errors"}}, "sync": the audit lines,
    "sent": the names sent, "exits": each process's last line where it failed}``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in (*(f"master-{s}.json" for s in SYNCS), "received.json", "trainer0.json", "trainer1.json",
              "trainer.store", "sync.jsonl"):
        (out / f).unlink(missing_ok=True)
    from mcore_dapo_checks.audit import audit_env

    env = {**os.environ, **audit_env(out), "OMP_NUM_THREADS": "1"}
    roles = [["trainer", "0"], ["trainer", "1"], ["rollout", "0"]]
    procs = [subprocess.Popen([sys.executable, "-m", MODULE, "--role", role, "--rank", rank, str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role, rank in roles]
    exits = {}
    for (role, rank), p in zip(roles, procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text = "timed out"
        lines = [x for x in text.splitlines() if "Error" in x] or text.splitlines()[-1:] or [f"exit {p.returncode}"]
        exits[f"{role}{rank}"] = lines[-1] if p.returncode else None

    def read(name: str) -> dict:
        f = out / name
        return {int(k): v for k, v in json.loads(f.read_text()).items()} if f.is_file() else {}

    received, trainers = read("received.json"), [read("trainer0.json"), read("trainer1.json")]
    syncs = {}
    for step, mutation in SYNCS.items():
        r = received.get(step)
        syncs[step] = {"mutation": mutation, "received": r and {k: r[k] for k in ("names", "committed", "equal")},
                       "errors": {"trainer0": trainers[0].get(step), "trainer1": trainers[1].get(step),
                                  "rollout0": r and r["error"]}}
    sync = [json.loads(x) for x in (out / "sync.jsonl").read_text().splitlines()] if (out / "sync.jsonl").is_file() else []
    return {"syncs": syncs, "sync": sync, "sent": [n for n, _ in weights()], "exits": exits}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.check_checkpoint_engine")
    ap.add_argument("out")
    ap.add_argument("--role", choices=["trainer", "rollout"], default=None)
    ap.add_argument("--rank", type=int, default=0)
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.role == "trainer":
        trainer(out, a.rank)
    elif a.role == "rollout":
        rollout(out)
    else:
        result = run(out)
        (out / "result.json").write_text(json.dumps(result))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
