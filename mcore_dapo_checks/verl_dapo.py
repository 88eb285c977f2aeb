"""One DAPO policy update with verl's own algorithm functions on this project's Megatron model.

``torchrun --nproc-per-node 2 -m mcore_dapo_checks.verl_dapo --hf-path DIR --ep 2 --work W --out R.json``
runs, under gloo on the CPU (or any device): rewards from verl's ``dapo`` reward manager
(overlong penalty), GRPO advantages (``compute_grpo_outcome_advantage``), verl's ``vanilla``
policy loss (clip low/high 0.2/0.28, clip_ratio_c 10, token-mean over the global batch),
backward through Megatron with DP/EP gradient reduction, gradient norm, clip 1.0, AdamW step,
then the rollout sync through :mod:`mcore_dapo.resharding` into an HF model. ``reference`` runs
the same update on the HF transformers model in one process, from the batch saved in ``W``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

LR, CLIP = 1e-3, 1.0
GROUPS, N, PROMPT, RESPONSE, OVERLONG = 2, 4, 4, 8, 4


def actor_config(dp_size: int, batch_num_tokens: int):
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="megatron", clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                      clip_ratio_c=10.0, loss_agg_mode="token-mean", ppo_mini_batch_size=GROUPS,
                      ppo_micro_batch_size_per_gpu=1, rollout_n=N)
    cfg.global_batch_info.update(dp_size=dp_size, batch_num_tokens=batch_num_tokens)
    return cfg


def tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{vocab_size - 1}")


def make_batch(vocab_size: int, seed: int = 7) -> dict:
    """Groups of N responses with lengths 3..8 (some inside the overlong buffer), DAPO rewards, GRPO advantages."""
    import numpy as np

    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.workers.reward_manager.dapo import DAPORewardManager

    g = torch.Generator().manual_seed(seed)
    bs = GROUPS * N
    prompts = torch.randint(0, vocab_size - 1, (GROUPS, PROMPT), generator=g).repeat_interleave(N, 0)
    responses = torch.randint(0, vocab_size - 1, (bs, RESPONSE), generator=g)
    lengths = torch.tensor([3, 8, 5, 7, 8, 4, 6, 8])[:bs]
    response_mask = (torch.arange(RESPONSE)[None] < lengths[:, None]).long()
    attention = torch.cat([torch.ones(bs, PROMPT, dtype=torch.long), response_mask], 1)
    answers = np.array([{"ground_truth": str(i % 3)} for i in range(bs)], dtype=object)

    def score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if len(solution_str.split()) % 3 == int(ground_truth) else -1.0

    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": attention},
        non_tensors={"reward_model": answers, "data_source": np.array(["tiny"] * bs, dtype=object)})
    manager = DAPORewardManager(tokenizer(vocab_size), num_examine=0, compute_score=score, max_resp_len=RESPONSE,
                                overlong_buffer_cfg=_Overlong())
    rewards = manager(data)
    index = np.array([i // N for i in range(bs)], dtype=object)
    adv, _ = compute_grpo_outcome_advantage(rewards, response_mask.float(), index)
    return {"tokens": torch.cat([prompts, responses], 1), "response_mask": response_mask.float(),
            "advantages": adv, "rewards": rewards.sum(-1)}


class _Overlong(dict):
    enable, len, penalty_factor, log = True, OVERLONG, 1.0, False


def response_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(response token) from [b, s, V] logits: positions PROMPT-1 .. s-2 predict the responses."""
    lp = torch.log_softmax(logits[:, PROMPT - 1:-1].float(), -1)
    return lp.gather(-1, tokens[:, PROMPT:, None]).squeeze(-1)


def policy_loss(old, new, batch, rows, dp_size):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    n_tokens = int(batch["response_mask"].sum())
    loss, metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=new, advantages=batch["advantages"][rows],
        response_mask=batch["response_mask"][rows], loss_agg_mode="token-mean",
        config=actor_config(dp_size, n_tokens))
    return loss, metrics


def hf_model(hf_path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(hf_path), dtype=dtype, attn_implementation="eager")


def reduce_grads(params) -> float:
    """verl/Megatron DDP semantics by hand: average over DP (experts: over expert-DP, scaled by 1/DP); the norm."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dp = ps.get_data_parallel_world_size()
    dense_sq, expert_sq = torch.zeros(()), torch.zeros(())
    for p in params:
        expert = not getattr(p, "allreduce", True)
        group = ps.get_expert_data_parallel_group() if expert else ps.get_data_parallel_group()
        dist.all_reduce(p.grad, group=group)
        p.grad.div_(dp)
        if expert:
            expert_sq += p.grad.float().pow(2).sum()
        else:
            dense_sq += p.grad.float().pow(2).sum()
    dist.all_reduce(expert_sq, group=ps.get_expert_model_parallel_group())
    return float((dense_sq + expert_sq).sqrt())


def run(a) -> dict:
    import torch.distributed as dist

    from mcore_dapo.bridge import Bridge, Layout
    from mcore_dapo.io.hf_reader import HFReader
    from mcore_dapo.resharding import HFQwen3MoeReceiver, WeightExporter, sync_weights
    from mcore_dapo.runtime.model import build_model, load_hf_weights
    from mcore_dapo.runtime.parallel import init_parallel, parallel_info

    layout = Layout.from_args(a)
    if (layout.tp, layout.pp) != (1, 1):
        from mcore_dapo.errors import UserError

        raise UserError(f"{layout.describe()} is not accepted by verl_dapo: accepted are layouts with EP alone "
                        "(TP1 PP1); verl_engine takes TP and PP")
    bridge = Bridge.from_hf(a.hf_path, layout)
    adapter = init_parallel(layout, "cpu")
    info = parallel_info()
    (model,), _ = build_model(bridge, adapter, dtype="fp32", aux_loss_coeff=0.0)
    with HFReader(a.hf_path) as reader:
        load_hf_weights([model], bridge, reader, info)
    batch = make_batch(bridge.cfg.vocab_size)
    bs, dp = batch["tokens"].shape[0], info.dp_size
    rows = slice(info.dp_rank * bs // dp, (info.dp_rank + 1) * bs // dp)
    tokens = batch["tokens"][rows]
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    model.eval()
    with torch.no_grad():
        old_all = response_logprobs(model(tokens, pos, None), tokens)
    noise = torch.randn(bs, RESPONSE, generator=torch.Generator().manual_seed(3))[rows] * 0.3
    old = old_all + noise  # an older policy, so that both clip ranges and clip_ratio_c act
    model.train()
    new = response_logprobs(model(tokens, pos, None), tokens)
    loss, metrics = policy_loss(old, new, batch, rows, dp)
    loss.backward()
    params = [p for p in model.parameters()]
    grad_norm = reduce_grads(params)
    torch.nn.utils.clip_grads_with_norm_(params, CLIP, torch.tensor(grad_norm))
    torch.optim.AdamW(params, lr=LR, weight_decay=0.1).step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    gathered = [torch.empty_like(old) for _ in range(dp)]
    dist.all_gather(gathered, old.contiguous())
    receiver = HFQwen3MoeReceiver(hf_model(a.hf_path))
    stats = sync_weights(WeightExporter([model], bridge, info), receiver, verify=True)
    if info.rank == 0:
        work = Path(a.work)
        torch.save({**batch, "old_log_prob": torch.cat(gathered)}, work / "batch.pt")
        torch.save({n: receiver.read_weight(n).clone() for n in bridge.hf_names()}, work / "received.pt")
    return {"loss": float(total) / dp, "grad_norm": grad_norm, "world_size": info.world_size,
            "layout": layout.describe(), "tensors_synced": stats.tensors, "rewards": batch["rewards"].tolist(),
            "metrics": metrics}


def reference(a) -> dict:
    """The same update on the HF transformers model, in one process, from the saved batch."""
    torch.manual_seed(0)
    work = Path(a.work)
    batch = torch.load(work / "batch.pt")
    model = hf_model(a.hf_path).train()
    new = response_logprobs(model(input_ids=batch["tokens"]).logits, batch["tokens"])
    loss, _ = policy_loss(batch["old_log_prob"], new, batch, slice(None), 1)
    loss.backward()
    params = [p for p in model.parameters()]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, CLIP))
    torch.optim.AdamW(params, lr=LR, weight_decay=0.1).step()
    from mcore_dapo.resharding import HFQwen3MoeReceiver

    received = torch.load(work / "received.pt")
    mine = HFQwen3MoeReceiver(model)
    start = HFQwen3MoeReceiver(hf_model(a.hf_path))
    diff = max(float((mine.read_weight(n) - t.float()).abs().max()) for n, t in received.items())
    moved = max(float((mine.read_weight(n) - t.view()).abs().max()) for n, t in start.targets.items())
    result = {"loss": float(loss), "grad_norm": grad_norm, "max_weight_diff": diff, "max_update": moved}
    if any(t.dtype == torch.bfloat16 for t in received.values()):
        result.update(half_precision_agreement(received, mine, start))
    return result


def beyond_one_step(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Where ``got`` (a half-precision tensor) is more than one step of its dtype's spacing at |ref| from
    the fp32 ``ref`` (rounding to that dtype alone is at most half a step)."""
    _, exp = torch.frexp(ref)  # |ref| in [2^(exp-1), 2^exp): spacing 2^(exp-1) * eps
    step = torch.ldexp(torch.full_like(ref, torch.finfo(got.dtype).eps), exp - 1)
    return (got.float() - ref).abs() > step


def half_precision_agreement(received: dict, updated, start) -> dict:
    """For weights received in bf16: how many elements are more than one bf16 step away from the
    fp32 reference update (rounding alone gives at most half a step), and how many the update moved."""
    beyond = moved = total = 0
    for name, t in received.items():
        ref = updated.read_weight(name).float()
        beyond += int(beyond_one_step(t, ref).sum())
        moved += int((t != start.read_weight(name).to(t.dtype)).sum())
        total += t.numel()
    return {"bf16_beyond_one_step": beyond / total, "bf16_moved": moved / total}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.verl_dapo")
    ap.add_argument("what", nargs="?", choices=["update", "reference"], default="update")
    ap.add_argument("--hf-path", required=True)
    ap.add_argument("--work", required=True)
    from mcore_dapo.bridge.layout import Layout

    Layout.add_args(ap, ("tp", "pp", "ep"), ep=2)  # EP alone: the update is compared at TP1 PP1
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.what == "reference":
        result = reference(a)
    else:
        import torch.distributed as dist

        from mcore_dapo.runtime.parallel import shutdown

        result = run(a)
        rank = dist.get_rank()
        shutdown()
        if rank:
            return 0
    text = json.dumps(result)
    Path(a.out).write_text(text) if a.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
