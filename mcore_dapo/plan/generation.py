"""Generation (the rollout's vLLM engine) per device and rollout layout: memory, time and the layout to run.

A model, stated here and in docs/PLANNER.md ("Generation"); every constant names its source, and the one guess
(the per-step overhead beyond the bytes read) says so.

**Layout.** verl 0.9.1's rollout keys ``tensor_model_parallel_size`` (TP), ``data_parallel_size`` (DP) and
``expert_parallel_size`` (EP). One engine spans ``TP x DP`` devices; the cluster holds ``world / (TP x DP)``
engines. Attention is split over TP (vLLM replicates KV heads when TP exceeds them: TP must divide the KV heads
or be a multiple of them) and data-parallel over DP; the experts are split over all ``TP x DP`` ranks of the
engine, whole experts with EP = TP x DP, each expert's ffn with EP = 1 (vLLM's MoE group is DP x TP either
way). Accepted: TP in {1, 2, 4, 8}, DP in {1, 2, 4, 8}, EP in {1, TP x DP}, ``TP x DP`` dividing the world size.

**Memory per rank.** bf16 weights (the model's table, :mod:`mcore_dapo.plan.params`, under the rollout's split)
and the KV cache inside ``gpu_memory_utilization x HBM`` less the runtime overhead (``OVERHEAD_GIB``); KV bytes per
token and rank ``2 (K, V) x layers x max(1, KV heads / TP) x head_dim x 2``. When the sequences' peak KV demand
exceeds what fits, the engine runs them in waves (vLLM queues or preempts); a layout fits when one whole sequence
(prompt + longest response) fits.

**Lengths.** ``clip`` of the sequences run to the longest response; the rest are spread evenly over
``[2 u - max, max]`` (or ``[0, 2 u]``), ``u`` their mean, so that the mean is the logged mean. A synchronous
rollout ends when its longest sequence ends: ``max`` decode steps, the batch shrinking as shorter ones finish.

**Time of an engine.** Prefill: ``2 x active params x prompt tokens / (TP x peak x efficiency)``. Each decode step
with ``n`` sequences in flight reads, per rank, its dense weights (less the embedding, a lookup), the experts
hit ``p(N) = 1 - (1 - k/E)^N`` of its expert weights (the expected share of ``E`` experts that ``N`` tokens, each
routing to ``k``, touch at least once; ``N`` the tokens of the engine's expert group, ``n x DP``) and the KV cache
of the sequences in flight, at the device's published HBM bandwidth; plus TP all-reduces and expert-group
exchanges at the planner's link figures (:func:`mcore_dapo.plan.timing._bandwidth`); plus a per-step overhead
(kernel launches, host scheduling and sampling, collective latency), which graph mode shrinks. Graph mode covers
steps up to ``CAPTURE_MAX`` sequences, larger steps run eagerly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from mcore_dapo.bridge import HFModelConfig, Layout
from mcore_dapo.errors import UserError
from mcore_dapo.plan.hardware import DEVICES, DeviceSpec
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.memory import GIB, OVERHEAD_GIB
from mcore_dapo.plan.params import _outside, model_params, rank_params
from mcore_dapo.plan.timing import _bandwidth, _ring
from mcore_dapo.plan.workload import Workload

WEIGHT_BYTES = 2  # bf16 rollout weights
KV_BYTES = 2  # bf16 KV cache (vLLM's default kv_cache_dtype "auto" = the model's dtype)
TP_SIZES = (1, 2, 4, 8)
DP_SIZES = (1, 2, 4, 8)
STEP_BLOCK = 32  # decode steps evaluated together (the batch changes little within a block)
# vLLM's largest captured decode batch by default (CompilationConfig max_cudagraph_capture_size 512); larger steps
# run eagerly. vllm-ascend's ACLGraph takes its capture sizes from the same setting.
CAPTURE_MAX = 512
# Eager over graph-mode time of a decode step dominated by its overhead: vllm-ascend #11593, Ascend A2, a large
# MoE at small batch: 75 ms/token eager, 35 ms/token with FULL_DECODE_ONLY graphs (+ flashcomm).
EAGER_OVER_GRAPH = 75.0 / 35.0


@dataclass(frozen=True)
class Measurement:
    """A published one-request decode time (time per output token) of Qwen3-30B-A3B in graph mode."""

    device: str
    tpot_s: float
    tp: int
    context: int
    source: str


# One request decodes launch-bound: its time less the bytes it must read is the per-step overhead in graph mode.
MEASURED = {
    "ascend": Measurement(
        "a2", 0.020, 4, 15000,
        "vllm-ascend #4656: Qwen3-30B-A3B, vllm-ascend 0.11.0rc2, TP4, cudagraph_mode FULL_DECODE_ONLY, one "
        "request with 15K input: TPOT 20+ ms (Qwen3-4B the same); the Ascend part is not named, taken as A2"),
    "cuda": Measurement(
        "a100", 0.0096, 1, 128,
        "tenstorrent/tt-inference-server #340: Qwen3-30B-A3B on A100 with vLLM (CUDA graphs, its default), "
        "concurrency 1, 128 in / 128 out: TPOT 9.6 ms; TP not stated, taken as 1"),
}


def family(device: DeviceSpec) -> str:
    return "ascend" if device.name == "a2" else "cuda"


def kv_bytes_per_token(cfg: HFModelConfig) -> int:
    """KV cache bytes of one token over all layers and KV heads (K and V, bf16)."""
    return 2 * cfg.num_layers * cfg.num_key_value_heads * cfg.head_dim * KV_BYTES


def kv_bytes_per_token_rank(cfg: HFModelConfig, tp: int) -> int:
    """One TP rank's share: ``KV heads / TP`` heads, at least one (vLLM replicates heads when TP exceeds them)."""
    return kv_bytes_per_token(cfg) * max(1, cfg.num_key_value_heads // tp) // cfg.num_key_value_heads


def experts_hit(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts ``tokens`` tokens touch, each routing to ``top_k`` of ``num_experts``
    (uniform routing): ``E (1 - (1 - k/E)^N)``."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** max(tokens, 0.0))


@dataclass(frozen=True)
class RolloutLayout:
    tp: int
    dp: int = 1
    ep: int = 1
    eager: bool = True

    @property
    def engine(self) -> int:
        return self.tp * self.dp

    def describe(self) -> str:
        return f"TP{self.tp} DP{self.dp} EP{self.ep} {'eager' if self.eager else 'graph'}"

    def keys(self) -> dict:
        return {"gen_tp": self.tp, "gen_dp": self.dp, "gen_ep": self.ep, "enforce_eager": self.eager}

    def script_vars(self) -> str:
        """The launch scripts' variables."""
        return f"GEN_TP={self.tp} GEN_DP={self.dp} GEN_EP={self.ep} ENFORCE_EAGER={self.eager}"

    def overrides(self) -> list[str]:
        r = "actor_rollout_ref.rollout"
        return [f"{r}.tensor_model_parallel_size={self.tp}", f"{r}.data_parallel_size={self.dp}",
                f"{r}.expert_parallel_size={self.ep}", f"{r}.enforce_eager={self.eager}"]

    def megatron_split(self) -> PlanLayout:
        """The same per-rank split in the planner's terms: attention over TP, experts over the engine's ranks."""
        if self.ep > 1:
            return PlanLayout(Layout(tp=self.tp, ep=self.ep, etp=1))
        return PlanLayout(Layout(tp=self.tp, ep=1, etp=self.engine))


def check_layout(cfg: HFModelConfig, lay: RolloutLayout, world: int) -> None:
    """Raise :class:`UserError` (one line, the bad value and the accepted ones) for an illegal rollout layout."""
    if lay.tp not in TP_SIZES:
        raise UserError(f"rollout tensor_model_parallel_size={lay.tp} is not accepted: accepted are "
                        f"{', '.join(map(str, TP_SIZES))}")
    if lay.dp not in DP_SIZES:
        raise UserError(f"rollout data_parallel_size={lay.dp} is not accepted: accepted are "
                        f"{', '.join(map(str, DP_SIZES))}")
    kv = cfg.num_key_value_heads
    if kv % lay.tp and lay.tp % kv:
        raise UserError(f"rollout tensor_model_parallel_size={lay.tp} is not accepted for {kv} KV heads: accepted "
                        "are divisors or multiples of the KV heads")
    if cfg.num_attention_heads % lay.tp:
        raise UserError(f"rollout tensor_model_parallel_size={lay.tp} does not divide the "
                        f"{cfg.num_attention_heads} attention heads: accepted are their divisors")
    if lay.ep not in (1, lay.engine):
        raise UserError(f"rollout expert_parallel_size={lay.ep} is not accepted with TP{lay.tp} DP{lay.dp}: "
                        f"accepted are 1 and TP x DP = {lay.engine} (vLLM)")
    if lay.ep > 1 and cfg.num_experts % lay.ep:
        raise UserError(f"rollout expert_parallel_size={lay.ep} does not divide the {cfg.num_experts} experts: "
                        "accepted are 1 and a TP x DP that divides them")
    if world % lay.engine:
        raise UserError(f"rollout TP x DP = {lay.engine} does not divide the {world} devices: accepted are "
                        "divisors of the world size")


def rollout_layouts(cfg: HFModelConfig, world: int) -> list[RolloutLayout]:
    out = []
    for tp in TP_SIZES:
        for dp in DP_SIZES:
            for ep in sorted({1, tp * dp}):
                for eager in (True, False):
                    lay = RolloutLayout(tp, dp, ep, eager)
                    try:
                        check_layout(cfg, lay, world)
                    except UserError:
                        continue
                    out.append(lay)
    return out


@dataclass(frozen=True)
class Lengths:
    """What one synchronous rollout generates: sequences, mean prompt, mean and longest response, clipped share."""

    sequences: int
    prompt_mean: float
    response_mean: float
    response_max: int
    clip_ratio: float

    def alive(self, t: float) -> float:
        """Share of the sequences still decoding after ``t`` tokens."""
        if t >= self.response_max:
            return 0.0
        c = min(max(self.clip_ratio, 0.0), 1.0)
        if c >= 1.0:
            return 1.0
        u = max(0.0, (self.response_mean - c * self.response_max) / (1.0 - c))  # mean of the unclipped
        hi = min(2.0 * u, float(self.response_max))
        lo = 2.0 * u - hi
        rest = 1.0 if t < lo else 0.0 if t >= hi else (hi - t) / (hi - lo)
        return c + (1.0 - c) * rest

    def as_dict(self) -> dict:
        return {"sequences": self.sequences, "prompt_mean": self.prompt_mean, "response_mean": self.response_mean,
                "response_max": self.response_max, "clip_ratio": self.clip_ratio}


@dataclass(frozen=True)
class Generation:
    layout: RolloutLayout
    engines: int
    sequences_per_rank: int  # per DP rank of an engine
    weights_gib: float
    kv_capacity_gib: float
    kv_peak_gib: float  # the sequences' peak KV demand, all at once
    fitting_sequences: int  # sequences of prompt + longest response whose KV fits a rank
    waves: int
    prefill_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    fits: bool

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.memory_s + self.comm_s + self.overhead_s

    def as_dict(self) -> dict:
        d = {**self.layout.keys(), "layout": self.layout.describe(), "engines": self.engines,
             "sequences_per_rank": self.sequences_per_rank, "fits": self.fits, "waves": self.waves,
             "fitting_sequences": self.fitting_sequences}
        for k in ("weights_gib", "kv_capacity_gib", "kv_peak_gib", "prefill_s", "memory_s", "comm_s", "overhead_s"):
            d[k] = round(getattr(self, k), 3)
        d["generation_s"] = round(self.total_s, 2)
        return d


def _read_bytes(cfg: HFModelConfig, lay: RolloutLayout) -> tuple[float, float, float]:
    """(weights held, dense weights read per step, expert weights held) of one rank, bytes."""
    pl = lay.megatron_split()
    rank = rank_params(cfg, pl, 0)
    embedding = 0 if cfg.tie_word_embeddings else _outside(cfg, lay.tp, cfg.vocab_size)[0]
    return (rank.total * WEIGHT_BYTES, (rank.dense - embedding) * WEIGHT_BYTES, rank.expert * WEIGHT_BYTES)


def _step_parts(cfg: HFModelConfig, device: DeviceSpec, lay: RolloutLayout, n: float, context: float,
                w: Workload | None) -> tuple[float, float]:
    """(memory-bound seconds, communication seconds) of one decode step with ``n`` sequences per DP rank of
    mean context ``context`` tokens."""
    _, dense, expert = _read_bytes(cfg, lay)
    hit = 1.0 - (1.0 - cfg.num_experts_per_tok / cfg.num_experts) ** (n * lay.dp) if cfg.is_moe else 1.0
    kv = n * context * kv_bytes_per_token_rank(cfg, lay.tp)
    memory = (dense + expert * hit + kv) / device.hbm_bytes_per_s
    if w is None:
        return memory, 0.0
    h, layers = cfg.hidden_size, cfg.num_layers
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(layers))
    act = n * h * 2  # one step's hidden states on a DP rank, bf16
    comm = 0.0
    if lay.tp > 1:  # all-reduce after attention and after the MLP / experts: 2 (g - 1) / g of the size each
        comm += 2 * layers * 2 * _ring(act, lay.tp) / _bandwidth(lay.tp, w)
    if lay.dp > 1 and moe_layers:
        if lay.ep > 1:  # all-to-all dispatch and combine of the routed tokens
            comm += 2 * moe_layers * _ring(act * cfg.num_experts_per_tok, lay.engine) / _bandwidth(lay.engine, w)
        else:  # the engine's tokens gathered to every rank and the outputs reduce-scattered
            comm += 2 * moe_layers * _ring(act * lay.dp, lay.engine) / _bandwidth(lay.engine, w)
    return memory, comm


@lru_cache(maxsize=None)
def graph_overhead_s(device_family: str) -> float:
    """Per-step overhead in graph mode: a published one-request step time less the bytes that step reads (the
    model's own memory time, Qwen3-30B-A3B, on the measurement's device and TP)."""
    from mcore_dapo.bridge import load_hf_config
    from mcore_dapo.resources import model_config

    m = MEASURED[device_family]
    ref = load_hf_config(model_config("qwen3-30b-a3b"))
    memory, _ = _step_parts(ref, DEVICES[m.device], RolloutLayout(m.tp), 1.0, m.context, None)
    return max(0.0, m.tpot_s - memory)


def step_overhead_s(device: DeviceSpec, eager: bool, measured_ms: tuple[float, float] | None = None) -> float:
    """The per-step overhead: ``measured_ms`` (eager, graph) where the device's was measured, else the guess:
    graph mode's from :data:`MEASURED`, eager mode's that times :data:`EAGER_OVER_GRAPH`."""
    if measured_ms is not None:
        return float(measured_ms[0 if eager else 1]) / 1e3
    g = graph_overhead_s(family(device))
    return g * EAGER_OVER_GRAPH if eager else g


def generation(cfg: HFModelConfig, w: Workload, lay: RolloutLayout, lengths: Lengths) -> Generation:
    """Projected seconds of one synchronous rollout of ``lengths`` on ``w``'s devices with layout ``lay``."""
    check_layout(cfg, lay, w.world_size)
    d = w.device
    engines = w.world_size // lay.engine
    per_rank = math.ceil(lengths.sequences / (engines * lay.dp))
    held, _, _ = _read_bytes(cfg, lay)
    kv_tok = kv_bytes_per_token_rank(cfg, lay.tp)
    capacity = w.gpu_memory_utilization * d.hbm_gib * GIB - held - OVERHEAD_GIB * GIB
    full = lengths.prompt_mean + lengths.response_max
    fitting = max(0, int(capacity // (full * kv_tok))) if capacity > 0 else 0
    peak_tokens = max(per_rank * lengths.alive(t) * (lengths.prompt_mean + t)
                      for t in range(0, lengths.response_max, STEP_BLOCK))
    fits = fitting >= 1
    waves = max(1, math.ceil(peak_tokens * kv_tok / capacity)) if fits else 1
    batch = per_rank / waves
    _, active = model_params(cfg)
    prefill = 2 * active * batch * lengths.prompt_mean / (lay.tp * d.bf16_tflops * 1e12 * w.efficiency)
    memory = comm = overhead = 0.0
    eager_s, graph_s = step_overhead_s(d, True, w.step_overhead_ms), step_overhead_s(d, False, w.step_overhead_ms)
    for start in range(0, lengths.response_max, STEP_BLOCK):
        steps = min(STEP_BLOCK, lengths.response_max - start)
        t = start + steps / 2
        n = batch * lengths.alive(t)
        if n <= 0:
            break
        m, c = _step_parts(cfg, d, lay, n, lengths.prompt_mean + t, w)
        memory, comm = memory + m * steps, comm + c * steps
        overhead += steps * (eager_s if lay.eager or n > CAPTURE_MAX else graph_s)
    return Generation(lay, engines, per_rank, held / GIB, max(capacity, 0.0) / GIB, peak_tokens * kv_tok / GIB,
                      fitting, waves, prefill * waves, memory * waves, comm * waves, overhead * waves, fits)


def rank(cfg: HFModelConfig, w: Workload, lengths: Lengths) -> list[Generation]:
    """Every legal rollout layout, those that fit first, fastest first (ties: the smaller engine, eager last)."""
    out = [generation(cfg, w, lay, lengths) for lay in rollout_layouts(cfg, w.world_size)]
    return sorted(out, key=lambda g: (not g.fits, round(g.total_s, 3), g.layout.engine, g.layout.ep,
                                      g.layout.eager))


def best(cfg: HFModelConfig, w: Workload, lengths: Lengths) -> Generation | None:
    ranked = rank(cfg, w, lengths)
    return ranked[0] if ranked and ranked[0].fits else None


def lengths_of(w: Workload, phases) -> Lengths:
    """The generated sequences of ``w`` (``gen_prompts x responses_per_prompt``) with ``phases``' lengths."""
    return Lengths(w.gen_prompts * w.responses_per_prompt, phases.prompt_mean, phases.mean_response,
                   int(phases.max_response), phases.clip_ratio)


def constants(w: Workload) -> dict:
    """The model's constants with their sources (for the JSON and the report): ``w``'s per-step overhead, measured
    where given, and the figures the guess is made of."""
    return {
        "step_overhead_s": {
            "eager": round(step_overhead_s(w.device, True, w.step_overhead_ms), 5),
            "graph": round(step_overhead_s(w.device, False, w.step_overhead_ms), 5),
            "source": "a guess (graph_overhead_s, eager_over_graph)" if w.step_overhead_ms is None
            else "measured (--step-overhead-ms)"},
        "eager_over_graph": round(EAGER_OVER_GRAPH, 4),
        "eager_over_graph_source": "vllm-ascend #11593: A2, a large MoE, 75 ms/token eager -> 35 ms/token graph",
        "graph_overhead_s": {f: round(graph_overhead_s(f), 5) for f in MEASURED},
        "measured": {f: {"tpot_s": m.tpot_s, "tp": m.tp, "context": m.context, "device": m.device,
                         "source": m.source} for f, m in MEASURED.items()},
        "capture_max": CAPTURE_MAX,
        "guess": "the per-step overhead (graph_overhead_s, and eager = graph x eager_over_graph)",
    }


def render(ranked: list[Generation], lengths: Lengths, w: Workload, top: int = 5) -> list[str]:
    d = w.device
    lines = [f"generation (a model: {lengths.sequences} sequences, prompt {lengths.prompt_mean:.0f}, response mean "
             f"{lengths.response_mean:.0f} / longest {lengths.response_max} ({lengths.clip_ratio:.0%} clipped); "
             f"weights, experts hit and KV read at {d.hbm_tbps:g} TB/s; per-step overhead, "
             f"{'measured' if w.step_overhead_ms is not None else 'a guess'}: eager "
             f"{step_overhead_s(d, True, w.step_overhead_ms) * 1e3:.1f} ms, graph "
             f"{step_overhead_s(d, False, w.step_overhead_ms) * 1e3:.1f} ms; vLLM share "
             f"{w.gpu_memory_utilization}):",
             f"  {'rollout layout':22s} {'engines':>7s} {'seq/rank':>8s} {'weights GiB':>11s} {'KV GiB':>7s} "
             f"{'waves':>5s} {'memory s':>8s} {'comm s':>6s} {'overhead s':>10s} {'gen s':>7s}  fits"]
    for g in ranked[:top]:
        lines.append(f"  {g.layout.describe():22s} {g.engines:7d} {g.sequences_per_rank:8d} {g.weights_gib:11.1f} "
                     f"{g.kv_capacity_gib:7.1f} {g.waves:5d} {g.memory_s:8.1f} {g.comm_s:6.1f} {g.overhead_s:10.1f} "
                     f"{g.total_s:7.1f}  {'yes' if g.fits else 'NO'}")
    b = ranked[0] if ranked and ranked[0].fits else None
    if b is None:
        lines.append(f"  no rollout layout fits {w.gpu_memory_utilization} x {d.hbm_gib:g} GiB: raise "
                     "--gpu-memory-utilization")
    else:
        lines.append(f"  best rollout layout: {b.layout.script_vars()} ({b.total_s:.1f} s projected generation)")
        lines.append("  " + " ".join(b.layout.overrides()))
    return lines


# ---- held against the guide's logged step -------------------------------------------------------------------
GUIDE_A2 = RolloutLayout(tp=2, dp=1, ep=1, eager=True)  # the guide's A2 script: gen_tp=2, enforce_eager=True
GUIDE_H100 = RolloutLayout(tp=2, dp=1, ep=1, eager=False)  # the guide's H100 script: gen_tp=2, enforce_eager=False
GUIDE_VLLM_TPS_RATIO = 0.16  # the guide's section 4.2: vllm_tps of A2 relative to H100
GUIDE_GEN_PROMPTS = 96  # the guide's data.gen_batch_size = 3 x train_batch_size; the log's batch/solve_* sum to 96


def guide_checks(cfg: HFModelConfig, phases=None) -> dict:
    """The model on the guide's two configurations (4 x 8 devices, the log's lengths, vLLM share 0.90): the A2
    projection against the logged ``generate_sequences``, and the A2 / H100 throughput ratio against 0.16."""
    from mcore_dapo.plan.hardware import get_device
    from mcore_dapo.plan.modes import GUIDE

    p = phases or GUIDE
    out = {}
    for name, lay in (("a2", GUIDE_A2), ("h100", GUIDE_H100)):
        w = Workload(get_device(name), nodes=4, gpu_memory_utilization=0.9, gen_prompts=GUIDE_GEN_PROMPTS)
        out[name] = generation(cfg, w, lay, lengths_of(w, p))
    a2, h100 = out["a2"], out["h100"]
    return {
        "a2": a2.as_dict(), "h100": h100.as_dict(),
        "a2_projected_s": round(a2.total_s, 2), "a2_logged_s": round(p.decode_s, 2),
        "a2_deviation": round(a2.total_s / p.decode_s - 1, 4),
        "a2_memory_bound_s": round(a2.prefill_s + a2.memory_s + a2.comm_s, 2),
        "a2_over_h100_ratio": round(h100.total_s / a2.total_s, 4), "guide_ratio": GUIDE_VLLM_TPS_RATIO,
    }


def main(argv=None) -> int:
    """``python -m mcore_dapo.plan.generation [--model DIR]``: the two checks against the guide, as in
    docs/PLANNER.md."""
    import argparse
    import json

    from mcore_dapo.bridge import load_hf_config
    from mcore_dapo.resources import model_path

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.plan.generation")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    a = ap.parse_args(argv)
    c = guide_checks(load_hf_config(model_path(a.model)))
    print(f"A2 guide configuration (TP2 eager, 16 engines on 32 devices, {c['a2']['sequences_per_rank']} sequences "
          f"each): projected {c['a2_projected_s']:.1f} s (memory-bound part {c['a2_memory_bound_s']:.1f} s, overhead "
          f"{c['a2']['overhead_s']:.1f} s) against the logged generate_sequences {c['a2_logged_s']:.1f} s: "
          f"{c['a2_deviation']:+.1%}")
    print(f"H100 guide configuration (TP2 graph): projected {c['h100']['generation_s']:.1f} s; A2 / H100 "
          f"throughput {c['a2_over_h100_ratio']:.2f} against the guide's {c['guide_ratio']}")
    print(json.dumps(c, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
