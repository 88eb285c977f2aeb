"""Time of the actor's share of a DAPO step (old log-probs + update), per layout.

* compute: ``6 x active params x tokens`` for the update (8 with full recompute: one
  more forward), ``2 x`` for the old log-prob forward, plus causal attention
  (``6 x layers x tokens x seq x q_dim`` over the whole step, halved for causality,
  with the same recompute and log-prob factors), at ``peak x efficiency`` over all devices;
* communication, not overlapped (an upper bound), per device: TP all-gather/reduce-scatter
  of sequence-parallel activations, EP all-to-all dispatch and combine, ETP gathers of
  routed tokens, CP key/value exchange, PP point-to-point, and the distributed
  optimizer's gradient reduce-scatter and weight all-gather over DP / expert-DP;
* the pipeline bubble ``(PP - 1) / (VPP x micro-batches)`` on top of compute.

A group uses the intra-node link when its ranks fit in one node (Megatron orders
ranks TP, CP, (EP), DP, PP from fastest to slowest), else the scale-out link.
Collectives are counted with ring volumes ``(g - 1) / g x size`` and an achieved
fraction ``LINK_EFFICIENCY`` of the link's bandwidth. Generation (vLLM) is not
modelled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.plan.layouts import PlanLayout
from mcore_dapo.plan.memory import MOE_IMBALANCE, micro_batches
from mcore_dapo.plan.params import layer_params, model_params, per_stage
from mcore_dapo.plan.workload import Workload

LINK_EFFICIENCY = 0.7


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    bubble_s: float
    tp_s: float
    ep_s: float
    cp_s: float
    pp_s: float
    dp_s: float
    micro_batches: int

    @property
    def comm_s(self) -> float:
        return self.tp_s + self.ep_s + self.cp_s + self.pp_s + self.dp_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + self.comm_s

    def as_dict(self) -> dict:
        d = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        d.update(comm_s=round(self.comm_s, 3), total_s=round(self.total_s, 3))
        return d


def _bandwidth(span: int, w: Workload) -> float:
    link = w.device.intra_bytes_per_s if span <= w.devices_per_node else w.device.inter_bytes_per_s
    return link * LINK_EFFICIENCY


def _ring(size_bytes: float, g: int) -> float:
    return (g - 1) / g * size_bytes if g > 1 else 0.0


def compute_seconds(cfg: HFModelConfig, w: Workload) -> float:
    _, active = model_params(cfg)
    passes = (8 if w.recompute == "full" else 6) + 2  # update (+ recompute forward) and old log-probs
    t = w.step_tokens
    attn = cfg.num_layers * t * w.sample_tokens * cfg.num_attention_heads * cfg.head_dim / 2
    flops = passes * active * t + passes * attn
    return flops / (w.world_size * w.device.bf16_tflops * 1e12 * w.efficiency)


def stage_imbalance(cfg: HFModelConfig, pl: PlanLayout) -> float:
    """Slowest stage's share of the active parameters over the mean share (1 for a balanced pipeline)."""
    if pl.layout.pp == 1:
        return 1.0
    k, e = cfg.num_experts_per_tok, max(cfg.num_experts, 1)
    loads = []
    for r in range(pl.layout.pp):
        layers = sum(pl.chunks(cfg.num_layers, r), [])
        load = sum(d + ex * k // e for d, ex in (layer_params(cfg, i, 1, 1, 1) for i in layers))
        loads.append(load + (cfg.vocab_size * cfg.hidden_size if r == pl.layout.pp - 1 else 0))
    return max(loads) * len(loads) / sum(loads)


def step_time(cfg: HFModelConfig, pl: PlanLayout, w: Workload) -> StepTime:
    lay, world = pl.layout, w.world_size
    h, k = cfg.hidden_size, max(cfg.num_experts_per_tok, 1)
    m = micro_batches(pl, w)
    v = lay.vpp or 1
    passes = 4 if w.recompute == "full" else 3  # update forward and backward, log-prob forward (+ recompute)
    tok = w.micro_batch_tokens  # per rank, per micro-batch, after the CP split
    layers = max(len(sum(pl.chunks(cfg.num_layers, r), [])) for r in range(lay.pp))
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers)) * layers / cfg.num_layers
    act = tok * h * 2  # one micro-batch's hidden states, bf16
    ops = 2 * layers + 2 * (layers - moe_layers)  # all-gather + reduce-scatter around attention and dense MLPs
    tp = passes * ops * _ring(act, lay.tp) * m / _bandwidth(lay.tp, w)
    ep_span = lay.expert_tp * lay.ep
    routed = act * k * MOE_IMBALANCE / lay.tp
    ep = passes * 2 * moe_layers * m * (_ring(routed, lay.ep) / _bandwidth(ep_span, w)
                                        + (lay.expert_tp - 1) * routed / _bandwidth(lay.expert_tp, w))
    kv = tok * 2 * cfg.num_key_value_heads * cfg.head_dim * 2 / lay.tp
    cp = passes * layers * m * (lay.cp - 1) * kv / _bandwidth(lay.tp * lay.cp, w)
    pp = 3 * v * m * act / lay.tp / _bandwidth(world, w) if lay.pp > 1 else 0.0
    worst = max(per_stage(cfg, pl), key=lambda r: r.total)
    # reduce-scatter the gradients, all-gather the bf16 weights (groups as in memory.optimizer_shard)
    dense_g = lay.dp(world) * lay.cp
    expert_g = lay.expert_dp(world) if lay.ep > 1 else dense_g
    dp_volume = (w.grad_bytes + 2) * (_ring(worst.dense, dense_g) + _ring(worst.expert, expert_g))
    dp = dp_volume / _bandwidth(world // lay.pp, w)
    compute = compute_seconds(cfg, w) * stage_imbalance(cfg, pl)
    bubble = compute * (lay.pp - 1) / (v * m) if lay.pp > 1 else 0.0
    return StepTime(compute, bubble, tp, ep, cp, pp, dp, m)
