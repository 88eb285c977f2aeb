"""Exact parameter counts of Megatron's GPTModel, per rank of a layout, read off the model's table
(``bridge/models/<model>/table.py``: each mapping's local shape under its group's size).

What a rank holds of Qwen3(-MoE) (megatron-core 0.16, local or Transformer Engine spec, which
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
from functools import lru_cache

from mcore_dapo.bridge import HFModelConfig
from mcore_dapo.bridge.bridge import layer_mappings
from mcore_dapo.bridge.mapping import Dims, Mapping
from mcore_dapo.bridge.megatron_config import padded_vocab_size
from mcore_dapo.bridge.models import get_model
from mcore_dapo.plan.layouts import PlanLayout


@dataclass(frozen=True)
class RankParams:
    dense: int  # replicated over DP (embedding, attention, norms, router, dense MLP, output)
    expert: int  # expert weights, replicated over expert-DP
    layers: int  # transformer layers held

    @property
    def total(self) -> int:
        return self.dense + self.expert


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dims(cfg: HFModelConfig, padded_vocab: int) -> Dims:
    return Dims(num_attention_heads=cfg.num_attention_heads, num_query_groups=cfg.num_key_value_heads,
                head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, padded_vocab_size=padded_vocab)


def _local_numel(m: Mapping, sizes: dict, dims: Dims, tp: int, etp: int) -> int:
    """One rank's share of mapping ``m`` (one expert's, for an expert mapping): the table's local shape."""
    size = {"tp": tp, "etp": etp, None: 1}[m.group]
    return _numel(m.local_shape(m.hf_shapes(sizes), size, dims))


@lru_cache(maxsize=1 << 16)
def layer_params(cfg: HFModelConfig, layer: int, tp: int, ep: int, etp: int) -> tuple[int, int]:
    """(dense, expert) parameters of one transformer layer on one rank: the local shapes of the model's table
    (its spec: :func:`mcore_dapo.bridge.models.get_model`), ``experts / EP`` of each expert mapping."""
    spec = get_model(cfg)
    table, _ = spec.table(cfg.tie_word_embeddings)
    sizes, dims = spec.hf_sizes(cfg), _dims(cfg, cfg.vocab_size)
    dense = expert = 0
    for m in layer_mappings(table, cfg, layer):
        n = _local_numel(m, sizes, dims, tp, etp)
        if m.per_expert:
            expert += (cfg.num_experts // ep) * n
        else:
            dense += n
    return dense, expert


def _outside(cfg: HFModelConfig, tp: int, padded_vocab: int) -> tuple[int, int, int]:
    """(first stage, last stage, copies) parameters outside the layers on one rank: the table's first mapping
    outside the layers (the embedding) sits on the first stage, the others (final norm, output layer) on the
    last; a copy (the tied output layer) is held on the last stage unless that is the first."""
    spec = get_model(cfg)
    table, copies = spec.table(cfg.tie_word_embeddings)
    sizes, dims = spec.hf_sizes(cfg), _dims(cfg, padded_vocab)
    outside = [m for m in table if not m.per_layer]
    by_name = {m.megatron: m for m in table}
    numel = [_local_numel(m, sizes, dims, tp, 1) for m in outside]
    copied = sum(_local_numel(by_name[orig], sizes, dims, tp, 1) for orig in copies.values())
    return numel[0], sum(numel[1:]), copied


def rank_params(cfg: HFModelConfig, pl: PlanLayout, pp_rank: int, *,
                vocab_divisible_by: int | None = None) -> RankParams:
    """What every rank at pipeline position ``pp_rank`` holds (the same for all its TP/EP/DP peers)."""
    lay = pl.layout
    vocab = padded_vocab_size(cfg.vocab_size, lay.tp, vocab_divisible_by)
    first_stage, last_stage, copied = _outside(cfg, lay.tp, vocab)
    chunks = pl.chunks(cfg.num_layers, pp_rank)
    dense = expert = 0
    for ci, layers in enumerate(chunks):
        first = pp_rank == 0 and ci == 0
        last = pp_rank == lay.pp - 1 and ci == len(chunks) - 1
        if first:
            dense += first_stage
        for layer in layers:
            d, e = layer_params(cfg, layer, lay.tp, lay.ep, lay.expert_tp)
            dense, expert = dense + d, expert + e
        if last:
            dense += last_stage
            if not first:
                dense += copied
    return RankParams(dense, expert, sum(len(c) for c in chunks))


def per_stage(cfg: HFModelConfig, pl: PlanLayout, **kw) -> list[RankParams]:
    return [rank_params(cfg, pl, r, **kw) for r in range(pl.layout.pp)]


def model_params(cfg: HFModelConfig) -> tuple[int, int]:
    """(total, active per token) parameters of the unsharded model; active counts the output layer, not
    the embedding lookup (no matmul), and top-k of the experts."""
    first_stage, last_stage, copied = _outside(cfg, 1, cfg.vocab_size)
    total = first_stage + last_stage  # embedding, final norm, output layer (unless tied)
    active = last_stage + copied  # final norm and output layer (or tied embedding)
    for layer in range(cfg.num_layers):
        d, e = layer_params(cfg, layer, 1, 1, 1)
        total += d + e
        active += d + (e * cfg.num_experts_per_tok // cfg.num_experts if e else 0)
    return total, active
