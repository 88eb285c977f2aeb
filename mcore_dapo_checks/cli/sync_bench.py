"""``mcore-dapo sync-bench``: time a trainer -> rollout weight sync of a checkpoint in a layout
(``--rollout vllm``: into a real vLLM engine, :mod:`mcore_dapo_checks.bench_vllm_sync`).

Hooked into ``mcore-dapo`` with :func:`add_commands`. The command starts the
benchmark under torchrun itself (CPU processes unless a device is given) and
prints a table, or the JSON result with ``--json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from mcore_dapo.bridge.layout import Layout


def add_commands(sub) -> None:
    p = sub.add_parser("sync-bench", help="benchmark the bucketed weight sync (Megatron -> HF tensors) of a checkpoint")
    p.add_argument("--hf-path", required=True, help="HF Qwen3(-MoE) checkpoint folder")
    Layout.add_args(p)
    p.add_argument("--bucket-mb", type=float, default=1024.0, help="bucket size in MiB (default 1024)")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: the layout's minimum world size)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None,
                   help="model and export dtype (default: the checkpoint's)")
    p.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    p.add_argument("--repeat", type=int, default=2, help="timed syncs (the best is reported)")
    p.add_argument("--output-ring", type=int, default=1,
                   help="output buffers reused in turn (default 1; 0: a fresh buffer per bucket)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before the run is abandoned")
    p.add_argument("--rollout", choices=["none", "vllm"], default="none",
                   help="none: time the export alone (default); vllm: sync into a real vLLM engine "
                        "(the CPU build, or vLLM / vllm-ascend on --device cuda / npu, colocated with rank 0) "
                        "through verl's weight-update path and check its parameters and log-probs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=sync_bench)


def _validated(a):
    from mcore_dapo.bridge import Layout, load_hf_config
    from mcore_dapo.errors import UserError, accepted

    cfg = load_hf_config(a.hf_path)
    layout = Layout.from_args(a).validate(cfg)
    nproc = a.nproc or layout.min_world_size()
    layout.validate(world_size=nproc)
    if not a.bucket_mb > 0:
        raise accepted("--bucket-mb", a.bucket_mb, "a positive size in MiB")
    if a.repeat < 1:
        raise accepted("--repeat", a.repeat, "at least 1")
    if a.rollout == "vllm":
        from mcore_dapo.devices import get_adapter
        from mcore_dapo.resharding.vllm_target import require_vllm

        require_vllm()
        get_adapter(a.device).rollout.check_model(cfg.head_dim)  # vLLM's CPU attention: its head sizes
    if a.output_ring < 0:
        raise accepted("--output-ring", a.output_ring, "0 or more")
    from mcore_dapo.io.hf_reader import INDEX

    if not any((Path(a.hf_path) / f).is_file() for f in ("model.safetensors", INDEX)):
        raise UserError(f"no safetensors weights in {a.hf_path!r}: sync-bench needs a checkpoint, not only a config")
    return layout, nproc


def _args(a, layout, status: Path) -> list[str]:
    if a.rollout == "vllm":
        args = ["--hf-path", str(a.hf_path), *layout.to_argv(), "--bucket-mb", str(a.bucket_mb), "--repeat",
                str(a.repeat), "--device", a.device, "--status-file", str(status)]
        return args + (["--dtype", a.dtype] if a.dtype else [])
    args = ["--hf-path", str(a.hf_path), *layout.to_argv(), "--bucket-mb", str(a.bucket_mb), "--repeat",
            str(a.repeat), "--output-ring", str(a.output_ring), "--device", a.device, "--status-file", str(status)]
    return args + (["--dtype", a.dtype] if a.dtype else [])


def _launch_with_progress(args: list[str], nproc: int, status: Path, timeout: float,
                          module: str = "mcore_dapo_checks.bench_weight_sync") -> dict:
    """torchrun in a thread; the bar shows what rank 0 reports it is doing."""
    from tqdm import tqdm

    from mcore_dapo.runtime.launch import torchrun

    box: dict = {}

    def target():
        try:
            box["result"] = torchrun(module, args, nproc, timeout=timeout)
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    with tqdm(desc="sync-bench: starting", bar_format="{desc} [{elapsed}]", file=sys.stderr,
              disable=None) as bar:
        while th.is_alive():
            th.join(0.5)
            if status.is_file():
                bar.set_description_str(f"sync-bench: {status.read_text()}")
            bar.update(0)
    if "error" in box:
        raise box["error"]
    return box["result"]


def sync_bench(a) -> int:
    from mcore_dapo_checks.bench_weight_sync import render
    from mcore_dapo_checks.bench_vllm_sync import render as render_vllm
    from mcore_dapo.runtime.launch import LaunchError

    layout, nproc = _validated(a)
    with tempfile.TemporaryDirectory(prefix="sync-bench-") as tmp:
        status = Path(tmp) / "status"
        t0 = time.time()
        try:
            module = "mcore_dapo_checks.bench_vllm_sync" if a.rollout == "vllm" else "mcore_dapo_checks.bench_weight_sync"
            r = _launch_with_progress(_args(a, layout, status), nproc, status, a.timeout, module)
        except LaunchError as e:
            print(f"sync-bench failed: {e}", file=sys.stderr)
            return 1
    r["nproc"] = nproc
    r["wall_seconds"] = round(time.time() - t0, 1)
    if a.rollout == "vllm":
        print(json.dumps(r, indent=1) if a.json else render_vllm(r))
        return 0 if r["exact"] else 1
    print(json.dumps(r, indent=1) if a.json else render(r))
    return 0 if r["bit_exact"] else 1
