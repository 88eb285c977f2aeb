"""``actor_rollout_ref.rollout.name=hf_cpu``: a rollout served on the CPU for verl 0.9.1's trainer, with HF
transformers as the engine (how the whole DAPO loop runs without an accelerator; not a fast inference engine).

:class:`CpuRolloutServer` is the Ray actor of one replica: sampling with temperature / top-p / top-k and
``ignore_eos``, the response length rules of verl's vLLM server, optional log-probs, with
``rollout.enable_rollout_routing_replay`` the routed experts of every token (R3); ``repetition_penalty`` and per-request
seeds are not applied (its generator is seeded from ``rollout.seed``, the replica rank and the weights' step, so a run
resumed from a checkpoint samples what the uninterrupted run sampled). Weights arrive through
:class:`~mcore_dapo.resharding.HFQwen3MoeReceiver`, staged and committed whole. verl's two classes (the replica and
the worker's adapter) are in :mod:`mcore_dapo.verl_cpu.replica`; this module does not import verl. How verl uses them:
docs/VERL_PLUGIN.md, "On the CPU: a verl platform and a rollout".
"""

from __future__ import annotations

import asyncio
import logging
import threading

import torch

NAME = "hf_cpu"
BUCKET_BYTES = 64 << 20

log = logging.getLogger(__name__)


def server_name(replica_rank: int) -> str:
    return f"mcore_dapo_hf_cpu_server_{replica_rank}"


def response_budget(config, prompt_len: int, sampling_params: dict) -> int:
    """max_tokens as verl's vLLM server computes it (explicit value, else the configured
    response length within prompt_length + response_length), clamped to [1, max_model_len - prompt]."""
    max_model_len = config.max_model_len or (config.prompt_length + config.response_length)
    possible = max_model_len - prompt_len
    if possible < 1:
        raise ValueError(f"prompt of {prompt_len} tokens leaves no room in max_model_len={max_model_len}")
    if "max_tokens" in sampling_params:
        n = sampling_params.pop("max_tokens")
    elif "max_new_tokens" in sampling_params:
        n = sampling_params.pop("max_new_tokens")
    else:
        n = min(config.response_length, config.prompt_length + config.response_length - prompt_len)
    return max(1, min(int(n), possible))


class RouteRecorder:
    """The experts the model's routers pick for every token fed through it, in verl's format:
    ``[tokens, MoE layers, top_k]`` int32 (what vLLM's ``enable_return_routed_experts`` returns)."""

    def __init__(self, model):
        self.rows: list[list[torch.Tensor]] = []
        self.handles = [m.register_forward_hook(self._hook(i)) for i, m in enumerate(moe_gates(model))]
        self.layers = len(self.handles)

    def _hook(self, i):
        def hook(module, args, output):
            if i == 0:
                self.rows.append([])
            self.rows[-1].append(output[2].detach().to(torch.int32))  # [tokens, top_k]
        return hook

    def routes(self) -> torch.Tensor:
        return torch.cat([torch.stack(step, dim=1) for step in self.rows])

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def moe_gates(model) -> list:
    """The top-k routers of an HF MoE model, by layer (dense layers have none): its family's router modules."""
    from mcore_dapo.bridge.models import get_model

    router = get_model(model.config.to_dict()).hf_router
    return [m for name, m in model.named_modules() if name.endswith(router) and hasattr(m, "top_k")]


def sample(model, prompt_ids: list[int], max_tokens: int, *, temperature: float = 1.0, top_p: float = 1.0,
           top_k: int = -1, eos: set[int] | None = None, generator: torch.Generator | None = None,
           want_logprobs: bool = False, want_routes: bool = False, stop=None):
    """Token-by-token sampling with a KV cache; greedy at temperature 0. Log-probs are those of
    the sampled token under the temperature-scaled distribution (what vLLM reports).
    ``want_routes``: a fourth value, the routed experts of every token fed (prompt and response
    but the last token), as :class:`RouteRecorder` gives them. ``stop``: a callable asked before each
    token; when it returns True the tokens so far come back with the reason ``"aborted"`` (partial rollout)."""
    recorder = RouteRecorder(model) if want_routes else None
    try:
        result = _sample(model, prompt_ids, max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, eos=eos,
                         generator=generator, want_logprobs=want_logprobs, stop=stop)
        return (*result, recorder.routes()) if recorder else result
    finally:
        if recorder:
            recorder.close()


def _sample(model, prompt_ids, max_tokens, *, temperature, top_p, top_k, eos, generator, want_logprobs, stop=None):
    eos = eos or set()
    ids = torch.tensor([prompt_ids])
    past, out, logps = None, [], []
    with torch.no_grad():
        for _ in range(max_tokens):
            if stop is not None and stop():
                return out, (logps if want_logprobs else None), "aborted"
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[0, -1].float()
            if temperature <= 0:
                tok = int(logits.argmax())
                lp = torch.log_softmax(logits, -1)[tok]
            else:
                logits = logits / temperature
                full = torch.log_softmax(logits, -1)
                if top_k is not None and 0 < top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                if top_p is not None and top_p < 1.0:
                    sorted_logits, order = torch.sort(logits, descending=True)
                    probs = torch.softmax(sorted_logits, -1)
                    drop = torch.cumsum(probs, -1) - probs > top_p
                    logits = logits.scatter(0, order[drop], float("-inf"))
                tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
                lp = full[tok]
            out.append(tok)
            logps.append(float(lp))
            if tok in eos:
                break
            ids = torch.tensor([[tok]])
    return out, (logps if want_logprobs else None), "completed"


class CpuRolloutServer:
    """One replica's engine: an HF transformers model on the CPU (a Ray actor)."""

    def __init__(self, config, model_config, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM

        from mcore_dapo.resharding import HFQwen3MoeReceiver
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config)
        self.replica_rank = replica_rank
        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(self.config.dtype), torch.float32)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, dtype=dtype).eval()
        self.receiver = HFQwen3MoeReceiver(self.model)
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        eos = eos if eos is not None else self.model.config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        self.generator = torch.Generator().manual_seed(int(self.config.seed) + replica_rank)
        self.lock = threading.Lock()  # one generation at a time; the weights change only between steps
        self.queue = None  # asyncio.Lock (FIFO), made in the actor's event loop
        self.global_steps = None
        self.weights_loaded = 0
        self.requests = 0
        self.aborted = 0  # requests cut by abort_all_requests (partial rollout), to be resumed by verl's client
        self.staged: list = []  # a sync's weights until it is committed whole
        self.stopping = False  # abort_all_requests: in-flight requests end at their next token
        self.running = None  # asyncio.Event, set while generation is allowed (cleared from abort to resume)
        self.commits: list[dict] = []  # per committed sync: step, tensors, hash of what was loaded

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data:
            raise NotImplementedError("the hf_cpu rollout serves text-only models")
        params = dict(sampling_params)
        max_tokens = response_budget(self.config, len(prompt_ids), params)
        want_logprobs = bool(params.pop("logprobs", False))
        want_routes = bool(self.config.enable_rollout_routing_replay)  # as verl's vLLM server asks vLLM

        def run():
            with self.lock:  # the weights and the version they are of, as one
                out = sample(self.model, list(prompt_ids), max_tokens, temperature=float(params.get("temperature", 1.0)),
                             top_p=float(params.get("top_p", 1.0)), top_k=int(params.get("top_k", -1)),
                             eos=set() if params.get("ignore_eos") else self.eos, generator=self.generator,
                             want_logprobs=want_logprobs, want_routes=want_routes, stop=lambda: self.stopping)
                return (*out, self.global_steps)

        self._events()
        await self.running.wait()  # parked while generation is paused (abort until resume), as vLLM's server
        async with self.queue:  # in arrival order (threading.Lock's waiters wake in no fixed order)
            await self.running.wait()
            tokens, logprobs, reason, *routes, version = await asyncio.to_thread(run)
        self.requests += 1
        self.aborted += reason == "aborted"
        return TokenOutput(token_ids=tokens, log_probs=logprobs, stop_reason=reason,
                           routed_experts=routes[0].numpy() if routes else None,
                           extra_fields={"global_steps": version})

    def _events(self) -> None:
        if self.queue is None:  # made in the actor's event loop
            self.queue = asyncio.Lock()
            self.running = asyncio.Event()
            self.running.set()

    def stage(self, weights: list) -> int:
        """A part of a sync, held until :meth:`commit` (the model is not touched)."""
        self.staged.extend((n, t) for n, t in weights)
        return len(weights)

    def discard(self) -> int:
        """A sync that did not complete: what was staged is dropped, the model keeps its weights."""
        n, self.staged = len(self.staged), []
        return n

    def commit(self, global_steps=None) -> int:
        """The staged sync loaded whole, under the generation lock: no request sees a mix of versions."""
        weights, self.staged = self.staged, []
        return self.load_weights(weights, global_steps)

    def load_weights(self, weights: list, global_steps=None) -> int:
        import time

        from mcore_dapo.verl_cpu.checkpoint_engine import StreamHash, record

        t0, h = time.time(), StreamHash()
        for name, t in weights:
            h.meta(name, t.shape, t.dtype)
            h.data(t)
        with self.lock:
            names = self.receiver.load_weights(weights)
            self.commits.append({"step": global_steps, "tensors": len(weights), "hash": h.hexdigest()})
        record("commit", self.replica_rank, global_steps, h, time.time() - t0)
        if global_steps is not None and global_steps != self.global_steps:
            # the generator restarts with each weight version: what a step samples does not depend on how many
            # draws earlier steps and validations took (a resumed run has not made them)
            import zlib

            key = repr((int(self.config.seed), self.replica_rank, int(global_steps))).encode()
            self.generator.manual_seed(zlib.crc32(key))
        if global_steps is not None:
            self.global_steps = global_steps
        self.weights_loaded += len(names)
        return len(names)

    def read_weight(self, name: str) -> torch.Tensor:
        return self.receiver.read_weight(name).clone()

    def stats(self) -> dict:
        return {"requests": self.requests, "weights_loaded": self.weights_loaded, "global_steps": self.global_steps,
                "aborted": self.aborted, "commits": list(self.commits)}

    # verl's replica/server control surface: nothing to free on the CPU; generation pauses and resumes (below)
    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        """Partial rollout (verl's colocate_async and separate_async): generation pauses; requests in flight end
        at their next token with the reason ``"aborted"`` and what they generated so far, which verl's
        ``FullyAsyncLLMServerClient`` sends again, prompt and partial response, after ``resume_generation``;
        requests arriving meanwhile wait for it."""
        self._events()
        self.running.clear()
        self.stopping = True
        await asyncio.to_thread(self.lock.acquire)  # the request in flight has returned
        self.lock.release()
        return None

    async def resume_generation(self):
        self._events()
        self.stopping = False
        self.running.set()
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None
