"""HF safetensors -> Megatron torch_dist checkpoint, loadable under any TP/PP/EP/ETP.

Each process builds only its shard of the model (``perform_initialization=False``) and reads
only the HF tensors of that shard, lazily, from the safetensors files; the HF model is never
built. Megatron's ``dist_checkpointing.save`` then writes the torch_dist format, whose keys
carry the global layer and expert axes, so the checkpoint is independent of the layout that
wrote it. Decoder layers are stacked under one key per tensor (a layer axis) when every layer is
alike, as standard Megatron/verl/MindSpeed configurations load them, and keyed per layer for a model
that mixes dense and MoE layers (see :mod:`mcore_dapo.io.dist_ckpt`). Run standalone (``mcore-convert hf2mcore --nproc N`` starts the processes) or under
torchrun (``torchrun --nproc-per-node N -m mcore_dapo.convert.hf2mcore ...``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from mcore_dapo.bridge import Bridge, Layout
from mcore_dapo.runtime.launch import peak_rss_mb
from mcore_dapo.io import output

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "generation_config.json", "added_tokens.json")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.convert.hf2mcore")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--partial", required=True, help="the hidden folder to write into")
    Layout.add_args(ap)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--out", default=None, help="JSON result file (rank 0)")
    return ap.parse_args(argv)


def checkpoint_dtype(reader) -> str:
    names = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
    found = {reader.dtype(n) for n in list(reader.keys())[:8]}
    if len(found) != 1 or next(iter(found)) not in names:
        return "bf16"
    return names[found.pop()]


def run(a) -> dict:
    import torch
    import torch.distributed as dist
    from tqdm import tqdm

    from mcore_dapo.io.dist_ckpt import save_dist_checkpoint
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    t0 = time.time()
    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter = init_parallel(layout, "cpu")
    info = parallel_info()
    partial = Path(a.partial)
    reader = HFReader(a.hf_path)
    dtype = checkpoint_dtype(reader) if a.dtype == "auto" else a.dtype
    chunks, _ = build_model(bridge, adapter, dtype=dtype)
    sums: dict[str, str] = {}
    read_bytes = 0
    def progress(params):  # tqdm closes the bar when the iteration ends
        return tqdm(params, desc="hf2mcore", unit="tensor", disable=not (a.progress and info.rank == 0),
                    file=sys.stderr)

    def record(lp, rank, hf):
        nonlocal read_bytes
        read_bytes += sum(t.numel() * t.element_size() for t in hf)
        if rank == 0:  # the first rank of each split group records the checksums (replicas agree: same bytes)
            for name, t in zip(lp.resolved.hf, hf):
                sums[name] = output.checksum(t)

    with torch.no_grad():
        load_hf_weights(chunks, bridge, reader, info, progress=progress, on_tensor=record)
    reader.close()
    t_read = time.time() - t0
    key_layout = save_dist_checkpoint(chunks, partial)
    gathered = [None] * info.world_size
    dist.all_gather_object(gathered, {"sums": sums, "read_bytes": read_bytes, "peak_rss_mb": peak_rss_mb()})
    result = {"seconds_read": round(t_read, 3), "seconds": round(time.time() - t0, 3), "dtype": dtype,
              "key_layout": key_layout}
    if info.rank == 0:
        all_sums = {}
        for g in gathered:
            all_sums.update(g["sums"])
        missing = set(bridge.hf_names()) - set(all_sums)
        if missing:
            raise RuntimeError(f"no rank converted {sorted(missing)[:3]}")
        result.update(tensors=len(all_sums), bytes_read=sum(g["read_bytes"] for g in gathered),
                      checksums=all_sums, peak_rss_mb=[g["peak_rss_mb"] for g in gathered])
    dist.barrier()
    return result


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


def copy_hf_side_files(hf_path: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(hf_path / "config.json", dest / "config.json")
    for f in TOKENIZER_FILES:
        if (hf_path / f).is_file():
            shutil.copy2(hf_path / f, dest / f)


if __name__ == "__main__":
    sys.exit(main())
