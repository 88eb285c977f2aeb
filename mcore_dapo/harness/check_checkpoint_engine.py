"""The gloo checkpoint engine (:mod:`mcore_dapo.verl_cpu.checkpoint_engine`) between processes, as verl's
``CheckpointEngineManager`` drives it (``prepare``, ``build_topology``, ``init_process_group``, ``send_weights`` on
every trainer rank, ``receive_weights`` on the rollout's, ``finalize``), without Ray or a model: two trainer ranks
(a gloo default group of their own, as Megatron's) and one rollout rank, each a process.

``python -m mcore_dapo.harness.check_checkpoint_engine OUT [--mutation none|corrupt|order]`` writes ``OUT/result.json``:
what the receiver got (names, and whether every tensor equals the sender's bit for bit), whether its consumer
committed (it commits only after the stream's end, as the hf_cpu server does), and each process's error line.
Mutations: ``corrupt``, one byte of one bucket flipped on the rollout's side after the broadcast; ``order``, the
second trainer rank yields the tensors in another order.
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

MODULE = "mcore_dapo.harness.check_checkpoint_engine"
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


def trainer(out: Path, rank: int, mutation: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{out / 'trainer.store'}")
    engine = _engine()(bucket_size=BUCKET, is_master=rank == 0)
    meta = engine.prepare()
    if rank == 0:
        (out / "master.json").write_text(json.dumps({"host": meta.host, "port": meta.port}))
    else:
        meta = _master(out)
    kwargs, _ = type(engine).build_topology(2, 1, [meta, None, None])
    engine.init_process_group(**{k: v[rank] for k, v in kwargs.items()})
    stream = weights()
    if mutation == "order" and rank == 1:
        stream = stream[1:] + stream[:1]
    asyncio.run(engine.send_weights(iter(stream), global_steps=3))
    engine.finalize()


def _master(out: Path):
    from mcore_dapo.verl_cpu.checkpoint_engine import MasterMetadata

    for _ in range(600):
        f = out / "master.json"
        if f.is_file() and f.read_text():
            return MasterMetadata(**json.loads(f.read_text()))
        time.sleep(0.1)
    raise TimeoutError("no master metadata")


def rollout(out: Path, mutation: str) -> None:
    engine = _engine()(bucket_size=BUCKET)
    engine.prepare()
    meta = _master(out)
    _, kwargs = type(engine).build_topology(2, 1, [meta, None, None])
    engine.init_process_group(**{k: v[0] for k, v in kwargs.items()})
    if mutation == "corrupt":
        broadcast = engine._broadcast
        count = {"n": 0}

        def flip(t):  # the third broadcast of a bucket-sized tensor arrives with one byte changed
            broadcast(t)
            if t.numel() == BUCKET:
                count["n"] += 1
                if count["n"] == 2:
                    t[17] ^= 0xFF
        engine._broadcast = flip
    got, committed = [], False

    async def consume():  # as the hf_cpu server: staged, committed after the stream's end
        nonlocal committed
        async for name, t in engine.receive_weights(global_steps=3):
            got.append((name, t.clone()))
        committed = True

    try:
        asyncio.run(consume())
    finally:
        sent = dict(weights())
        (out / "received.json").write_text(json.dumps({
            "names": [n for n, _ in got], "committed": committed,
            "equal": all(t.dtype == sent[n].dtype and torch.equal(t.view(torch.uint8), sent[n].view(torch.uint8))
                         for n, t in got)}))
        engine.finalize()


def run(out: Path, mutation: str = "none", timeout: float = 400) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("master.json", "received.json", "trainer.store", "sync.jsonl"):
        (out / f).unlink(missing_ok=True)
    env = {**os.environ, "MCORE_DAPO_AUDIT_DIR": str(out), "OMP_NUM_THREADS": "1"}
    roles = [["trainer", "0"], ["trainer", "1"], ["rollout", "0"]]
    procs = [subprocess.Popen([sys.executable, "-m", MODULE, "--role", role, "--rank", rank, "--mutation", mutation,
                               str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for role, rank in roles]
    errors = {}
    for (role, rank), p in zip(roles, procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            text = "timed out"
        lines = [x for x in text.splitlines() if "Error" in x] or text.splitlines()[-1:] or [f"exit {p.returncode}"]
        errors[f"{role}{rank}"] = lines[-1] if p.returncode else None
    received = json.loads((out / "received.json").read_text()) if (out / "received.json").is_file() else None
    sync = [json.loads(x) for x in (out / "sync.jsonl").read_text().splitlines()] if (out / "sync.jsonl").is_file() else []
    return {"received": received, "errors": errors, "sync": sync, "sent": [n for n, _ in weights()]}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.harness.check_checkpoint_engine")
    ap.add_argument("out")
    ap.add_argument("--role", choices=["trainer", "rollout"], default=None)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--mutation", choices=["none", "corrupt", "order"], default="none")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.role == "trainer":
        trainer(out, a.rank, a.mutation)
    elif a.role == "rollout":
        rollout(out, a.mutation)
    else:
        result = run(out, a.mutation)
        (out / "result.json").write_text(json.dumps(result))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
