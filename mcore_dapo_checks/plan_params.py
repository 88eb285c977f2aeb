"""Build the real sharded Megatron model for one or more layouts and compare per-rank parameter counts
with the planner's prediction.

Run under torchrun, one process per device; the layouts of one launch share its world size and
are built one after the other (Megatron's parallel state is re-initialised between them)::

    torchrun --nproc-per-node 4 -m mcore_dapo_checks.plan_params --hf-path MODEL_DIR \\
        --layouts '[{"tp": 2, "ep": 2}, {"pp": 2, "ep": 2, "first": 1, "last": 3}]'

``--hf-path`` may be repeated; a layout's ``"model": i`` picks the i-th (default 0). Parameter
counts do not depend on CP, which the CPU refuses (context parallelism needs Transformer Engine).

Rank 0 writes the JSON result to ``--out`` (or stdout): for each layout, every rank's
coordinates, its real dense/expert parameter counts, the predicted ones and whether they agree.

On a GPU or NPU node (``--device cuda`` or ``npu``, ``--dtype bf16``) every rank also reports
``weight_bytes``, what the allocator holds once the model is built, beside
``predicted_weight_bytes`` (the planner's parameter memory). Only ``config.json`` is read, no
weights, so the real model can be checked on one node, for example::

    torchrun --nproc-per-node 8 -m mcore_dapo_checks.plan_params --hf-path configs/models/qwen3-30b-a3b \\
        --device cuda --dtype bf16 \\
        --layouts '[{"tp": 2, "ep": 8, "etp": 1}, {"tp": 4, "pp": 2, "ep": 4, "etp": 1, "vpp": 2}]'

The rest of the memory estimate (gradients, optimizer, activations) is checked against a training
run's ``perf/max_memory_allocated_gb`` (docs/PLANNER.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.params import rank_params
from mcore_dapo.plan.planner import stage_overrides

LAYOUT_KEYS = ("tp", "pp", "ep", "etp", "cp", "vpp", "first", "last")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.plan_params")
    ap.add_argument("--hf-path", required=True, action="append", help="model folder (repeatable)")
    ap.add_argument("--layouts", required=True, help=f"JSON list of objects with keys among {', '.join(LAYOUT_KEYS)}")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def plan_layout(d: dict) -> PlanLayout:
    unknown = set(d) - set(LAYOUT_KEYS) - {"model"}
    if unknown:
        raise ValueError(f"unknown layout keys {sorted(unknown)}: accepted are {', '.join(LAYOUT_KEYS)}")
    lay = Layout(tp=d.get("tp", 1), pp=d.get("pp", 1), ep=d.get("ep", 1), etp=d.get("etp"), cp=d.get("cp", 1),
                 vpp=d.get("vpp"))
    return PlanLayout(lay, d.get("first"), d.get("last"))


FIELDS = ("rank", "pp_rank", "tp_rank", "ep_rank", "dense", "expert", "predicted_dense", "predicted_expert",
          "weight_bytes")


def count_params(chunks, bridge: Bridge, info) -> tuple[int, int]:
    """(dense, expert) parameters of this rank's chunks, a shared parameter counted once."""
    from mcore_dapo.runtime.model import local_params

    seen, counts = set(), [0, 0]
    for lp in local_params(chunks, bridge, info):
        if id(lp.param) not in seen:
            seen.add(id(lp.param))
            counts[lp.resolved.mapping.per_expert] += lp.param.numel()
    return counts[0], counts[1]


def check_layout(hf_path: str, pl: PlanLayout, device, dtype: str) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from mcore_dapo.runtime.model import build_model
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    t0 = time.time()
    bridge = Bridge.from_hf(hf_path, pl.layout)
    adapter = init_parallel(pl.layout, device)
    info = parallel_info()
    adapter.fast.check_context_parallel(pl.layout.cp)
    before = adapter.memory_allocated()
    chunks, _ = build_model(bridge, adapter, dtype=dtype, overrides=stage_overrides(pl))
    weight_bytes = -1 if before is None else adapter.memory_allocated() - before
    dense, expert = count_params(chunks, bridge, info)
    pred = rank_params(bridge.cfg, pl, info.pp_rank)
    mine = torch.tensor([info.rank, info.pp_rank, info.tp_rank, info.ep_rank, dense, expert, pred.dense,
                         pred.expert, weight_bytes], dtype=torch.long, device=adapter.local_device())
    rows = [torch.zeros_like(mine) for _ in range(info.world_size)]
    dist.all_gather(rows, mine)
    del chunks
    ps.destroy_model_parallel()
    ranks = [dict(zip(FIELDS, (int(x) for x in r.tolist()))) for r in rows]
    elem = {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
    for r in ranks:
        r["predicted_weight_bytes"] = (r["predicted_dense"] + r["predicted_expert"]) * elem
        if r["weight_bytes"] < 0:
            del r["weight_bytes"]
    ok = all(r["dense"] == r["predicted_dense"] and r["expert"] == r["predicted_expert"] for r in ranks)
    return {"layout": pl.describe(), **pl.as_dict(), "world_size": info.world_size, "device": adapter.name,
            "dtype": dtype, "match": ok, "ranks": ranks, "seconds": round(time.time() - t0, 2)}


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import finish_worker

    a = parse_args(argv)
    specs = json.loads(a.layouts)
    layouts = [plan_layout(d) for d in specs]  # every spec checked before any model is built
    results = []
    for d, pl in zip(specs, layouts):
        r = check_layout(a.hf_path[d.get("model", 0)], pl, a.device, a.dtype)
        results.append({"model": d.get("model", 0), **r})
    return finish_worker({"layouts": results, "all_match": all(r["match"] for r in results)}, a.out)


if __name__ == "__main__":
    sys.exit(main())
