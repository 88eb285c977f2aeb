"""The naive HF -> Megatron conversion, kept only as the benchmark's baseline.

What the field's scripts do: every process loads the whole HF model with transformers
``from_pretrained``, then fills its Megatron shard from that in-memory state dict and saves.
Run with one process by ``tools/bench_convert.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.resharding.receivers import hub_slices_of
from mcore_dapo.runtime.launch import peak_rss_mb


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from mcore_dapo.io.dist_ckpt import save_dist_checkpoint
    from mcore_dapo.runtime.model import build_model, local_params
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info, shutdown

    ap = argparse.ArgumentParser()
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--partial", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    t0 = time.time()
    layout = Layout(ep=int(__import__("os").environ.get("WORLD_SIZE", "1")))
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter = init_parallel(layout, "cpu")
    info = parallel_info()
    hf = AutoModelForCausalLM.from_pretrained(a.hf_path, dtype=torch.bfloat16)
    # transformers 5 holds experts fused in memory; the bridge gives back the hub names
    hub_slices = hub_slices_of(hf)
    state = {hub: t[index] for name, t in hf.state_dict().items()
             for hub, index in hub_slices(name, tuple(t.shape)).items()}
    chunks, _ = build_model(bridge, adapter, dtype="bf16")
    with torch.no_grad():
        for lp in local_params(chunks, bridge, info):
            m = lp.resolved.mapping
            rank, size = info.group_rank(m.group)
            lp.param.data.copy_(m.to_megatron([state[h] for h in lp.resolved.hf], rank, size, bridge.dims))
    del hf, state
    save_dist_checkpoint(chunks, a.partial)
    if dist.get_rank() == 0:
        Path(a.out).write_text(json.dumps({"seconds": round(time.time() - t0, 3), "peak_rss_mb": peak_rss_mb()}))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
