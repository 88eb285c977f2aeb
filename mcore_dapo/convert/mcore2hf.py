"""Megatron torch_dist checkpoint -> HF safetensors shards with index and config.

N processes load the checkpoint with Megatron's ``dist_checkpointing`` under TP1/PP1/EP
(EP as large as divides both N and the experts), so each holds 1/N of the experts and no
tensor needs a gather; the checkpoint's decoder keys may be stacked or per layer. Each process writes the HF tensors it owns (its experts; a
round-robin share of the replicated ones) through the bridge's ``to_hf``; rank 0 names the
shards ``model-0000i-of-0000n.safetensors`` and writes the index.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.runtime.launch import peak_rss_mb
from mcore_dapo.io import output
from mcore_dapo.io.hf_shards import SHARD_BYTES, ShardWriter


def export_layout(num_experts: int, nproc: int) -> Layout:
    return Layout(ep=math.gcd(num_experts, nproc) if num_experts else 1)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.convert.mcore2hf")
    ap.add_argument("--mcore-path", required=True)
    ap.add_argument("--hf-config", required=True, help="folder with the model's config.json")
    ap.add_argument("--partial", required=True)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--shard-bytes", type=int, default=SHARD_BYTES)
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _owned(chunks, bridge, info):
    """(resolved, param) pairs this rank writes: its experts, and its share of the replicated tensors."""
    from megatron.core import parallel_state as ps

    from mcore_dapo.runtime.model import local_params

    edp, edp_rank = ps.get_expert_data_parallel_world_size(), ps.get_expert_data_parallel_rank()
    out = []
    for i, lp in enumerate(local_params(chunks, bridge, info)):
        if lp.resolved.expert is not None:
            if lp.resolved.expert % edp == edp_rank:
                out.append(lp)
        elif i % info.dp_size == info.dp_rank:
            out.append(lp)
    return out


def run(a) -> dict:
    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    from mcore_dapo.io.dist_ckpt import load_dist_checkpoint
    from mcore_dapo.runtime.model import build_model
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    t0 = time.time()
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    cfg_bridge = Bridge.from_hf(a.hf_config)
    layout = export_layout(cfg_bridge.cfg.num_experts, world)
    bridge = Bridge(cfg_bridge.cfg, layout)
    adapter = init_parallel(layout, "cpu")
    info = parallel_info()
    chunks, _ = build_model(bridge, adapter, dtype=a.dtype)
    key_layout = load_dist_checkpoint(chunks, a.mcore_path)
    t_load = time.time() - t0
    writer, sums = ShardWriter(Path(a.partial), a.shard_bytes, prefix=f"rank{info.rank:05d}"), {}
    owned = _owned(chunks, bridge, info)
    bar = tqdm(owned, desc="mcore2hf", unit="tensor", disable=not (a.progress and info.rank == 0), file=sys.stderr)
    with torch.no_grad():
        for lp in bar:
            tensors = lp.resolved.mapping.to_hf([lp.param.detach()], bridge.dims)
            for name, t in zip(lp.resolved.hf, tensors):
                t = t.contiguous()  # views of the parameters where possible: no copy held per shard
                sums[name] = output.checksum(t)
                writer.add(name, t)
    writer.flush()
    bar.close()
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, {"files": writer.parts, "sums": sums, "bytes": writer.bytes_written,
                                      "peak_rss_mb": peak_rss_mb()})
    result = {"seconds_load": round(t_load, 3), "seconds": round(time.time() - t0, 3)}
    if info.rank == 0:
        result.update(parts=[f for g in gathered for f in g["files"]],
                      checksums={k: v for g in gathered for k, v in g["sums"].items()},
                      bytes_written=sum(g["bytes"] for g in gathered), layout=layout.describe(),
                      key_layout=key_layout,
                      peak_rss_mb=[g["peak_rss_mb"] for g in gathered])
    dist.barrier()
    return result


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
