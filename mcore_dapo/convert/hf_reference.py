"""The HF model's reference for the forward check (:mod:`mcore_dapo.convert.forward_check`, behind
``mcore-convert verify``): a right-padded batch of a checkpoint's vocabulary, the HF transformers model's logits on
it, and the loss and gradients of the training loss over it, computed in a clean process (no patch of this package
applied)::

    python -m mcore_dapo.convert.hf_reference HF_DIR OUT.pt [--batch B --seq S --dtype D --padded-vocab V]
"""

from __future__ import annotations

import json
from pathlib import Path


def tiny_prompts(vocab_size: int, batch: int = 2, seq: int = 16, seed: int = 1234):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq), generator=g)


PAD_ID = 0
# the lengths of a reference batch's sequences, cycled, as fractions of --seq: every sequence padded, and the shares
# of 2 or 4 data-parallel ranks with different numbers of loss tokens (at 16: 15, 11, 6, 9 tokens; 14+10 and 5+8
# loss tokens at DP2)
LENGTHS = (15 / 16, 11 / 16, 6 / 16, 9 / 16)


def tiny_batch(vocab_size: int, batch: int = 4, seq: int = 16, seed: int = 1234) -> dict:
    """A right-padded batch of sequences of different lengths, as verl pads its batches: ``tokens`` [B, S] (the
    pad id past each length), ``attention_mask`` [B, S] (1 on real tokens), ``labels`` [B, S] (the next token,
    the pad id where there is none) and ``loss_mask`` [B, S] (1 where a real token predicts a real one)."""
    import torch

    tokens = tiny_prompts(vocab_size, batch, seq, seed)
    lengths = torch.tensor([max(2, min(seq, round(seq * LENGTHS[i % len(LENGTHS)]))) for i in range(batch)])
    pos = torch.arange(seq)
    attention = pos < lengths[:, None]
    loss = pos < lengths[:, None] - 1
    tokens = tokens.masked_fill(~attention, PAD_ID)
    labels = torch.roll(tokens, -1, dims=1).masked_fill(~loss, PAD_ID)
    return {"tokens": tokens, "attention_mask": attention.long(), "labels": labels, "loss_mask": loss.long()}


def hf_reference_logits(hf_path: str | Path, tokens, dtype: str = "float32", attention_mask=None):
    """Logits of the HF transformers model (eager attention), as float32. Run in a clean process."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_path), dtype=getattr(torch, dtype),
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=attention_mask).logits.float()


def hf_reference_grads(hf_path: str | Path, tokens, labels, padded_vocab: int | None = None,
                       attention_mask=None, loss_mask=None) -> tuple[float, dict]:
    """The HF model's token-mean cross-entropy of ``labels`` over the whole batch's ``loss_mask`` tokens (all
    tokens without one: verl's token-mean over the global batch) and the gradient of every parameter under the
    hub's names (the fused in-memory experts split per expert), float32, eager attention, no auxiliary
    loss (the engine trains with ``aux_loss_coeff=0``). ``padded_vocab``: the loss over that many logits,
    the rows past the vocabulary at zero, as a Megatron output layer padded with zero rows computes it
    (Megatron's cross-entropy does not mask padded rows). Run in a clean process."""
    import torch
    from transformers import AutoModelForCausalLM

    from mcore_dapo.resharding.receivers import hub_slices_of

    model = AutoModelForCausalLM.from_pretrained(str(hf_path), dtype=torch.float32, attn_implementation="eager")
    hub_slices = hub_slices_of(model)
    model.train()
    logits = model(input_ids=tokens, attention_mask=attention_mask).logits.float()
    if padded_vocab:
        logits = torch.cat([logits, logits.new_zeros(*logits.shape[:-1], padded_vocab - logits.shape[-1])], -1)
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                  reduction="none")
    mask = torch.ones_like(per_token) if loss_mask is None else loss_mask.reshape(-1).float()
    loss = (per_token * mask).sum() / mask.sum()
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        for hub, index in hub_slices(name, tuple(p.shape)).items():
            grads[hub] = p.grad[index].detach().clone()
    return float(loss.detach()), grads


def main(argv=None) -> int:
    import argparse

    import torch

    ap = argparse.ArgumentParser(prog="python -m mcore_dapo.convert.hf_reference")
    ap.add_argument("path", help="the HF checkpoint's folder")
    ap.add_argument("out", help="the reference's file (torch.save)")
    ap.add_argument("--batch", type=int, default=4,
                    help="sequences, split over the data-parallel ranks of the forward check")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--padded-vocab", type=int, default=None,
                    help="the training loss's gradients over this many logits (zero rows past the vocabulary)")
    ap.add_argument("--grads", action="store_true",
                    help="also the training loss and its gradients (what forward_check --backward compares)")
    a = ap.parse_args(argv)
    vocab = json.loads((Path(a.path) / "config.json").read_text())["vocab_size"]
    b = tiny_batch(vocab, a.batch, a.seq)
    out = {**b, "logits": hf_reference_logits(a.path, b["tokens"], a.dtype, b["attention_mask"]),
           "padded_vocab": a.padded_vocab}
    if a.grads:  # the training loss of forward_check --backward: next-token labels, a token-mean over the loss mask
        out["loss"], out["grads"] = hf_reference_grads(a.path, b["tokens"], b["labels"], a.padded_vocab,
                                                       b["attention_mask"], b["loss_mask"])
    torch.save(out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
