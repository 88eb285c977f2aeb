"""Forward (and backward) passes through Megatron's own pipeline schedules."""

from __future__ import annotations

import torch


def _gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """[b, s, v/tp] on each TP rank -> [b, s, v] (padded vocab)."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return logits
    parts = [torch.empty_like(logits) for _ in range(tp)]
    torch.distributed.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def data_parallel_rows(n: int) -> slice:
    """This rank's rows of a global batch of ``n`` sequences: its data-parallel rank's contiguous share, as
    verl splits a batch over the data-parallel ranks (the TP, PP and CP ranks of one data-parallel rank share
    its rows)."""
    from megatron.core import parallel_state as ps

    from mcore_dapo.errors import accepted

    dp, rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    if n % dp:
        raise accepted("batch", n, f"a multiple of the {dp} data-parallel ranks")
    share = n // dp
    return slice(rank * share, (rank + 1) * share)


def run_schedule(chunks, tokens: torch.Tensor, *, labels: torch.Tensor | None = None,
                 loss_mask: torch.Tensor | None = None, num_tokens: int | None = None,
                 forward_only: bool = True, micro_batch_size: int = 1):
    """Run ``tokens`` [B, S] through the model with Megatron's forward-backward function.

    Returns, on the last pipeline stage, the full-vocab logits [B, S, V_padded]
    (forward_only) or the list of per-microbatch losses; ``None`` elsewhere.

    With ``loss_mask`` [B, S] and ``num_tokens`` (the loss-mask tokens of the global batch, over every
    data-parallel rank) the loss is verl's token-mean over the global batch: a micro-batch's loss is its
    masked cross-entropy sum over ``num_tokens``, and the list holds these parts (their sum over micro-batches
    and data-parallel ranks is the global loss). Backpropagated is that part times the data-parallel size
    (verl's ``agg_loss``, trainer/ppo/core_algos.py) and times the number of micro-batches (verl's engine,
    workers/engine/megatron/transformer_impl.py): Megatron's schedule divides by the latter and its DDP by the
    former. Padding is on the right: the causal mask keeps every real token from the padding after it.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    b, s = tokens.shape
    if b % micro_batch_size:
        raise ValueError(f"batch {b} not divisible by micro batch {micro_batch_size}")
    device = next(chunks[0].parameters()).device  # the inputs go where the model is
    tokens = tokens.to(device)
    labels = None if labels is None else labels.to(device)
    position_ids = torch.arange(s, device=device).unsqueeze(0)
    batches = []
    for i in range(0, b, micro_batch_size):
        mb = {"tokens": tokens[i:i + micro_batch_size], "position_ids": position_ids.expand(micro_batch_size, s)}
        if labels is not None:
            mb["labels"] = labels[i:i + micro_batch_size]
        if loss_mask is not None:
            mb["loss_mask"] = loss_mask[i:i + micro_batch_size].to(device)
        batches.append(mb)
    if loss_mask is not None and not num_tokens:
        raise ValueError("a loss mask needs the global batch's number of loss tokens (num_tokens)")
    scale = ps.get_data_parallel_world_size() * (b // micro_batch_size)
    outputs = []

    def forward_step(data_iterator, model):
        mb = next(data_iterator)
        out = model(mb["tokens"], mb["position_ids"], None, labels=mb.get("labels"))

        def loss_func(output_tensor):
            if "loss_mask" in mb:
                part = (output_tensor.float() * mb["loss_mask"]).sum() / num_tokens
                outputs.append(part.detach().clone())
                return part * scale, {"loss": part.detach().clone()}
            if "labels" in mb:
                loss = output_tensor.float().mean()
                # a copy: Megatron's schedule divides the returned loss by the number of micro-batches in place
                outputs.append(loss.detach().clone())
                return loss, {"loss": loss.detach().clone()}
            outputs.append(_gather_vocab(output_tensor.detach()))
            return output_tensor.float().sum() * 0.0, {}

        return out, loss_func

    it = iter(batches)
    iters = [iter(batches) for _ in chunks] if len(chunks) > 1 else it
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iters,
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(batches),
        seq_length=s,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return None
    if labels is not None:
        return outputs
    return torch.cat(outputs, dim=0)
