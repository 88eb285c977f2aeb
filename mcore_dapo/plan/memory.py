"""Per-device memory of a colocated verl + Megatron actor, per pipeline stage, in GiB.

Two phases share each device (verl's hybrid engine):

* rollout: vLLM holds ``gpu_memory_utilization x HBM``; the actor keeps what is not offloaded
  (``none``: weights, gradients, optimizer; ``optimizer``: weights and gradients; ``param``: the optimizer;
  ``param+optimizer``: nothing, verl's param/grad/optimizer offload);
* update: vLLM sleeps (KV cache freed, weights offloaded); the actor holds bf16 weights,
  the fp32 gradient buffer, the distributed optimizer's fp32 master weights and Adam moments
  (12 bytes per parameter, sharded over DP for dense and over expert-DP for expert
  parameters), the activations of the micro-batches in flight, the logits of one
  micro-batch and one layer's MoE dispatch buffers.

Activations are counted per token with flash attention (no s^2 term) and sequence
parallelism when TP > 1 (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", adapted to GQA and routed experts). Assumptions, all
stated here: routed tokens are ``top-k x MOE_IMBALANCE`` per token; logits cost 8 bytes
per token and vocabulary entry (fp32 logits and their gradient); a fixed
``OVERHEAD_GIB`` covers the runtime context, communicator buffers and fragmentation.
Router replay (R2/R3) holds one micro-batch's routes on the device: tokens x MoE layers x top-k
x ``REPLAY_BYTES`` (int32 expert indices, the rollout's format); counted whether replay is on or not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.bridge.megatron_config import padded_vocab_size
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.params import RankParams, per_stage
from mcore_dapo.plan.workload import Workload

GIB = 1024**3
MOE_IMBALANCE = 1.2
OVERHEAD_GIB = 3.0
LOGIT_BYTES = 8
REPLAY_BYTES = 4


def replay_bytes(cfg: HFModelConfig, tokens: float) -> float:
    """Router replay data of ``tokens`` tokens: tokens x MoE layers x top-k x 4 bytes."""
    if not cfg.is_moe:
        return 0.0
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    return tokens * moe_layers * cfg.num_experts_per_tok * REPLAY_BYTES


@dataclass(frozen=True)
class StageMemory:
    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    dispatch: float
    replay: float
    overhead: float
    update_total: float
    rollout_total: float

    @property
    def peak(self) -> float:
        return max(self.update_total, self.rollout_total)

    def as_dict(self) -> dict:
        d = {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}
        d["peak"] = round(self.peak, 2)
        return d


def layer_activation_bytes(cfg: HFModelConfig, layer: int, pl: PlanLayout, recompute: str) -> float:
    """Bytes kept per sequence token of one micro-batch for one layer (recompute none/selective)."""
    lay = pl.layout
    tp, etp = lay.tp, lay.expert_tp
    h, hd, nh = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    q, kv = nh * hd, cfg.num_key_value_heads * hd
    seq_sharded = 4 * h  # norm input, QKV input (sequence-parallel when TP > 1)
    core = 2 * (q + 2 * kv) + 4 * nh  # core attention inputs and its fp32 log-sum-exp
    head_sharded = 2 * (q + kv) + 2 * q + (core if recompute == "none" else 0)
    b = (seq_sharded + head_sharded) / tp
    if cfg.is_moe_layer(layer):
        f, k = cfg.moe_intermediate_size, cfg.num_experts_per_tok
        b += (4 * h + 8 * cfg.num_experts) / tp  # norm and router inputs, fp32 logits and probs
        routed = k * MOE_IMBALANCE * etp / tp  # expert tokens on this rank per sequence token
        b += routed * (4 * h + 6 * f / etp)  # fc1 input, fc1 output, activation, fc2 output
    else:
        b += 4 * h / tp + 6 * cfg.intermediate_size / tp
    return b


def micro_batches(pl: PlanLayout, w: Workload) -> int:
    """Micro-batches per DP replica in one optimizer step (verl packs ``micro_batch_tokens x CP``)."""
    dp = pl.layout.dp(w.world_size)
    per_replica = w.step_tokens / dp
    return max(1, -(-int(per_replica) // (w.micro_batch_tokens * pl.layout.cp)))


def in_flight_layers(pl: PlanLayout, stage: int, layers: int, m: int) -> float:
    """Layers' worth of one micro-batch's activations held by ``stage`` at the 1F1B peak."""
    pp, v = pl.layout.pp, pl.layout.vpp or 1
    if v == 1:
        return min(pp - stage, m) * layers
    chunks = min(m * v, (pp - stage - 1) * 2 + (v - 1) * pp + 1)  # Megatron's interleaved warm-up + 1
    return chunks * layers / v


def optimizer_shard(pl: PlanLayout, rp: RankParams, world: int) -> float:
    """Parameters whose optimizer state this rank owns. Megatron shards dense parameters over DP x CP and
    expert parameters over expert-DP, but only when EP > 1 (with EP = 1 they count as dense)."""
    lay = pl.layout
    dense_group = lay.dp(world) * lay.cp
    if lay.ep == 1:
        return rp.total / dense_group
    return rp.dense / dense_group + rp.expert / lay.expert_dp(world)


def stage_memory(cfg: HFModelConfig, pl: PlanLayout, w: Workload, stage: int, rp: RankParams) -> StageMemory:
    lay, world = pl.layout, w.world_size
    tokens = w.micro_batch_tokens  # sequence tokens per rank of one micro-batch (after the CP split)
    params = 2 * rp.total
    grads = w.grad_bytes * rp.total
    optimizer = 12 * optimizer_shard(pl, rp, world)
    layers = [i for c in pl.chunks(cfg.num_layers, stage) for i in c]
    per_layer = [layer_activation_bytes(cfg, i, pl, w.recompute) for i in layers]
    held = in_flight_layers(pl, stage, len(layers), micro_batches(pl, w))
    if w.recompute == "full":  # only each layer's input is kept; one layer is rebuilt at a time
        acts = held * 2 * cfg.hidden_size / lay.tp + max(per_layer, default=0)
    else:
        acts = held * (sum(per_layer) / len(per_layer) if per_layer else 0)
    acts *= tokens
    last = stage == lay.pp - 1
    logits = LOGIT_BYTES * tokens * padded_vocab_size(cfg.vocab_size, lay.tp) / lay.tp if last else 0.0
    dispatch = 0.0
    if cfg.is_moe and layers:
        dispatch = 2 * tokens * cfg.num_experts_per_tok * MOE_IMBALANCE / lay.tp * 2 * cfg.hidden_size
    replay = replay_bytes(cfg, tokens)
    resident = {"none": params + grads + optimizer, "optimizer": params + grads, "param": optimizer,
                "param+optimizer": 0.0}[w.offload]
    oh = OVERHEAD_GIB * GIB
    update = params + grads + optimizer + acts + logits + dispatch + replay + oh
    rollout = resident + oh + w.gpu_memory_utilization * w.device.hbm_gib * GIB
    g = lambda x: x / GIB  # noqa: E731
    return StageMemory(stage, g(params), g(grads), g(optimizer), g(acts), g(logits), g(dispatch), g(replay), OVERHEAD_GIB,
                       g(update), g(rollout))


def estimate_memory(cfg: HFModelConfig, pl: PlanLayout, w: Workload) -> list[StageMemory]:
    return [stage_memory(cfg, pl, w, s, rp) for s, rp in enumerate(per_stage(cfg, pl))]
