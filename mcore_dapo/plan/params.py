"""Exact parameter counts of Megatron's GPTModel for Qwen3(-MoE), per rank of a layout.

What a rank holds (megatron-core 0.16, local or Transformer Engine spec, which
have the same parameter sizes):

* first stage, first virtual chunk: the word embedding, ``padded_vocab / TP x hidden``;
* every layer: two RMSNorm weights (hidden), q/k RMSNorm (head_dim each), the fused
  QKV projection split over TP, the output projection split over TP;
* a MoE layer: the router (experts x hidden, replicated) and ``experts / EP`` local
  experts, each a gated fc1 (``2 * ffn / ETP x hidden``) and an fc2 (``hidden x ffn / ETP``);
* a dense layer: a gated MLP split over TP;
* last stage, last chunk: the final norm and the output layer (vocab-parallel), unless
  tied to the embedding on the same chunk.

Expert parameters are reduced over expert-DP and sharded there by the distributed
optimizer; everything else over DP. The split matters for the memory estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.bridge.megatron_config import padded_vocab_size
from mcore_dapo.plan.layouts import PlanLayout


@dataclass(frozen=True)
class RankParams:
    dense: int  # replicated over DP (embedding, attention, norms, router, dense MLP, output)
    expert: int  # expert weights, replicated over expert-DP
    layers: int  # transformer layers held

    @property
    def total(self) -> int:
        return self.dense + self.expert


def layer_params(cfg: HFModelConfig, layer: int, tp: int, ep: int, etp: int) -> tuple[int, int]:
    """(dense, expert) parameters of one transformer layer on one rank."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    dense = 2 * h + 2 * hd  # input and pre-MLP norms, q/k norms
    dense += (q + 2 * kv) // tp * h + h * (q // tp)
    if cfg.is_moe_layer(layer):
        f = cfg.moe_intermediate_size
        dense += cfg.num_experts * h
        expert = (cfg.num_experts // ep) * (2 * (f // etp) * h + h * (f // etp))
        return dense, expert
    f = cfg.intermediate_size
    return dense + 2 * (f // tp) * h + h * (f // tp), 0


def rank_params(cfg: HFModelConfig, pl: PlanLayout, pp_rank: int, *,
                vocab_divisible_by: int | None = None) -> RankParams:
    """What every rank at pipeline position ``pp_rank`` holds (the same for all its TP/EP/DP peers)."""
    lay = pl.layout
    vocab = padded_vocab_size(cfg.vocab_size, lay.tp, vocab_divisible_by)
    h = cfg.hidden_size
    chunks = pl.chunks(cfg.num_layers, pp_rank)
    dense = expert = 0
    for ci, layers in enumerate(chunks):
        first = pp_rank == 0 and ci == 0
        last = pp_rank == lay.pp - 1 and ci == len(chunks) - 1
        if first:
            dense += vocab // lay.tp * h
        for layer in layers:
            d, e = layer_params(cfg, layer, lay.tp, lay.ep, lay.expert_tp)
            dense, expert = dense + d, expert + e
        if last:
            dense += h
            if not (cfg.tie_word_embeddings and first):
                dense += vocab // lay.tp * h
    return RankParams(dense, expert, sum(len(c) for c in chunks))


def per_stage(cfg: HFModelConfig, pl: PlanLayout, **kw) -> list[RankParams]:
    return [rank_params(cfg, pl, r, **kw) for r in range(pl.layout.pp)]


def model_params(cfg: HFModelConfig) -> tuple[int, int]:
    """(total, active per token) parameters of the unsharded model; active counts the output layer, not
    the embedding lookup (no matmul), and top-k of the experts."""
    h = cfg.hidden_size
    total = active = cfg.vocab_size * h + h  # output layer (or tied embedding) + final norm
    if not cfg.tie_word_embeddings:
        total += cfg.vocab_size * h
    for layer in range(cfg.num_layers):
        d, e = layer_params(cfg, layer, 1, 1, 1)
        total += d + e
        active += d + (e * cfg.num_experts_per_tok // cfg.num_experts if e else 0)
    return total, active
