"""Weight-sync benchmark into the real vLLM engine. Run under torchrun (``mcore-dapo sync-bench --rollout vllm``
launches it)::

    torchrun --nproc-per-node 2 -m mcore_dapo_checks.bench_vllm_sync --hf-path DIR --ep 2

Rank 0 starts one vLLM engine (the CPU build, or vLLM / vllm-ascend on the device rank 0 uses) on *dummy*
weights (vLLM's ``load_format="dummy"``), so a sync that writes nothing cannot pass. All ranks build the
sharded Megatron model from the checkpoint; the export plan is checked against the engine's config; then ``--repeat`` times the exporter's stream goes
through verl's ``ServerAdapter.update_weights`` into vLLM's ``load_weights`` (timed on rank 0, from the
first exported tensor to the update's return). After the last sync the engine's parameters are compared
with the export bit for bit where the engine holds them (a layer at a time), vLLM's prompt log-probs on
fixed tokens are compared with HF transformers' on the same weights, and memcpy bandwidth is measured in
the same processes (the bound the GB/s are set against). Rank 0 writes the JSON result.

On ``--device cuda|npu`` the engine is colocated with rank 0 (one device given to its Ray actor, verl's IPC
transfer; checked by device UUID on CUDA) and keeps ``--gpu-memory-utilization`` of the device; the
read-back copies go to the host, and the HF log-prob reference runs on the CPU.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time

import torch
import torch.distributed as dist

from mcore_dapo_checks.bench_weight_sync import DTYPES, TORCH, _status, bench_parser, kv_table

VLLM_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_args(argv=None):
    ap = bench_parser("python -m mcore_dapo_checks.bench_vllm_sync")
    ap.add_argument("--device", choices=("cpu", "cuda", "npu"), default="cpu")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--sync-timeout", type=float, default=1800.0)
    ap.add_argument("--decode-batches", type=lambda v: [int(x) for x in v.split(",") if x], default=[],
                    help="after the syncs, time the engine's decode steps at these batch sizes (comma-separated)")
    ap.add_argument("--decode-tokens", type=int, default=17, help="tokens generated per timed run (at least 2)")
    a = ap.parse_args(argv)
    if a.decode_tokens < 2 or any(b < 1 for b in a.decode_batches):
        from mcore_dapo.errors import UserError

        raise UserError(f"--decode-tokens={a.decode_tokens} --decode-batches={a.decode_batches} are not accepted: "
                        "accepted are at least 2 tokens and positive batch sizes")
    return a


def _by_layer(tensors: dict) -> list[dict]:
    """The tensors in groups of one decoder layer each (and one group for the rest)."""
    groups: dict = {}
    for n, t in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.", n)
        groups.setdefault(int(m.group(1)) if m else -1, {})[n] = t
    return [groups[k] for k in sorted(groups)]


def _hf_logprobs(hf_path, sent: dict, dtype, tokens) -> list[list[float]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    from mcore_dapo.resharding import HFQwen3MoeReceiver

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(hf_path)), dtype=dtype,
                                             attn_implementation="eager").eval()
    HFQwen3MoeReceiver(model).load_weights(list(sent.items()))
    sent.clear()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor(tokens)).logits.float(), -1)
    return [[float(logp[b, i - 1, t[i]]) for i in range(1, len(t))] for b, t in enumerate(tokens)]


def run(a) -> dict:
    import ray

    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo_checks.check_vllm_sync import _rollout_adapter, start_engine_host
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    layout = Layout.from_args(a)
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter_dev = init_parallel(layout, a.device)
    info = parallel_info()
    with HFReader(a.hf_path) as reader:
        dtype = a.dtype or DTYPES.get(reader.dtype(reader.keys()[0]), "bf16")
        host = adapter = None
        if info.rank == 0:
            _status(a, "starting vLLM (dummy weights)")
            host = start_engine_host(a.hf_path, a.device, load_format="dummy", dtype=VLLM_DTYPE[dtype],
                                     gpu_memory_utilization=a.gpu_memory_utilization)
            if adapter_dev.has_device_memory():  # vLLM sizes its share of the device before the model beside it
                ray.get(host.config.remote())
            adapter = _rollout_adapter(max(1, int(a.bucket_mb)))
        try:
            _status(a, "building the sharded model")
            chunks, _ = build_model(bridge, adapter_dev, dtype=dtype)
            load_hf_weights(chunks, bridge, reader, info)
            return _bench(a, bridge, chunks, info, host, adapter, dtype)
        finally:
            if info.rank == 0:
                ray.shutdown()


def _bench(a, bridge, chunks, info, host, adapter, dtype) -> dict:
    import ray

    from mcore_dapo_checks.bench_weight_sync import memcpy_gbps
    from mcore_dapo_checks.tiny import tiny_prompts
    from mcore_dapo.errors import UserError
    from mcore_dapo_checks.check_vllm_sync import device_uuid, vllm_layout
    from mcore_dapo.resharding import WeightExporter, check_before_writing
    from mcore_dapo.resharding.vllm_target import VllmTarget

    exporter = WeightExporter(chunks, bridge, info, bucket_bytes=max(1, int(a.bucket_mb * (1 << 20))),
                              dtype=TORCH[dtype])
    cfg = ray.get(host.config.remote()) if info.rank == 0 else None  # waits for the engine to be up
    if info.rank == 0 and (theirs := ray.get(host.device_uuid.remote())) != (mine := device_uuid(a.device)):
        raise UserError(f"the vLLM engine's GPU (uuid {theirs}) is not rank 0's (uuid {mine}): verl's IPC weight "
                        "transfer needs one device; Ray gives the engine the first visible GPU, rank 0 must use it")
    check_before_writing(exporter, VllmTarget(cfg) if info.rank == 0 else None)
    rss_before = ray.get(host.peak_rss_mb.remote()) if info.rank == 0 else None
    sent: dict[str, torch.Tensor] = {}
    times = []
    for i in range(a.repeat):
        _status(a, f"sync {i + 1}/{a.repeat} into vLLM")
        last = i == a.repeat - 1

        def stream():
            for name, t in exporter.iter_weights():
                if last and info.rank == 0:
                    sent[name] = t.detach().to("cpu", copy=True)
                yield name, t

        dist.barrier()
        t0 = time.perf_counter()
        if info.rank == 0:
            asyncio.run(asyncio.wait_for(adapter.update_weights(stream(), global_steps=i + 1), timeout=a.sync_timeout))
        else:
            for _ in stream():
                pass
        times.append(time.perf_counter() - t0)
    plan = exporter.plan
    mem = memcpy_gbps(max(b.numel for b in plan.buckets), plan.buckets[0].dtype, exporter.device)
    r = None
    if info.rank == 0:
        rss_after = ray.get(host.peak_rss_mb.remote())
        _status(a, "comparing the engine's parameters with the export")
        engine_names = set(ray.get(host.param_names.remote()))
        want = vllm_layout(sent, cfg, engine_names)
        missing, extra = sorted(set(want) - engine_names), sorted(engine_names - set(want))
        differ = []
        for group in _by_layer(want):
            differ += ray.get(host.differ.remote(group))
        del want
        nbytes = sum(x.numel() * x.element_size() for x in sent.values())
        ntensors = len(sent)
        best = min(times)
        fixed = tiny_prompts(bridge.cfg.vocab_size, batch=2, seq=12, seed=7).tolist()
        _status(a, "vLLM vs HF log-probs")
        ours = ray.get(host.prompt_logprobs.remote(fixed))
        ref = _hf_logprobs(a.hf_path, sent, TORCH[dtype], fixed)
        decode = {}
        if a.decode_batches:
            _status(a, "vLLM decode steps")
            decode = ray.get(host.decode_step_ms.remote(a.decode_batches, a.decode_tokens))
        r = {
            "layout": bridge.layout.describe(), "world_size": info.world_size, "device": a.device, "dtype": dtype,
            "rollout": "vllm", "tensors": ntensors, "bytes": nbytes,
            "seconds": round(best, 4), "seconds_all": [round(x, 4) for x in times],
            "gbps": round(nbytes / best / 1e9, 3),
            "memcpy_gbps": round(mem, 3), "of_memcpy": round(nbytes / best / 1e9 / mem, 4),
            "engine_peak_rss_mb_before": round(rss_before), "engine_peak_rss_mb_after": round(rss_after),
            "engine_params": len(engine_names), "missing": missing[:3], "extra": extra[:3], "differ": len(differ),
            "first_differ": differ[0] if differ else None, "exact": not (missing or extra or differ),
            "logprob_max_diff": max(abs(x - y) for o, h in zip(ours, ref) for x, y in zip(o, h)),
            # ms per decode step by batch size, eager (the engine's enforce_eager): the planner's per-step overhead
            # on this device, less the bytes a step reads (docs/PLANNER.md, "What would settle the guess")
            "decode_step_ms": {str(b): ms for b, ms in decode.items()}, "layers": bridge.cfg.num_layers,
        }
    return r


def render(r: dict) -> str:
    """The result as a small table."""
    rows = [
        ("layout", f"{r['layout']} on {r['world_size']} {r['device']} processes, {r['dtype']}, into vLLM"),
        ("tensors / bytes", f"{r['tensors']} / {r['bytes'] / 1e9:.3f} GB"),
        ("sync into vLLM", f"{r['seconds']} s ({r['gbps']} GB/s); all runs {r['seconds_all']}"),
        ("limit: memcpy", f"{r['memcpy_gbps']} GB/s (the sync reaches {r['of_memcpy']:.1%} of it)"),
        ("engine peak RSS", f"{r['engine_peak_rss_mb_before']} MB before the syncs, {r['engine_peak_rss_mb_after']} MB "
                            "after"),
        ("engine params == export", "yes" if r["exact"] else
         f"NO ({r['differ']} differ, first {r['first_differ']}; missing {r['missing']}; extra {r['extra']})"),
        ("vLLM vs HF log-probs", f"max |diff| {r['logprob_max_diff']:.3g}"),
    ]
    if r.get("decode_step_ms"):
        rows.append(("decode step (eager)", ", ".join(f"batch {b}: {ms} ms" for b, ms in r["decode_step_ms"].items())
                     + f" ({r['layers']} layers)"))
    return kv_table(rows)


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
