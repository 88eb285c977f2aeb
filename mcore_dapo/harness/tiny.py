"""Generate tiny Qwen3 / Qwen3-MoE checkpoints with transformers (seeded, hub layout, safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

# the word-level ChatML tokenizer of the tiny trainer runs (harness/tiny_dapo.py, harness/math_task.py)
WORDS, NEWLINE, IM_END, PAD = 253, 253, 254, 255


def chatml_tokenizer(words: list[str]):
    """A word-level tokenizer: ``words`` (253 of them) for ids 0 .. 252 plus the ChatML pieces verl's Qwen
    handling relies on (``\\n`` as one token, ``<|im_end|>`` as end of turn, ``<|endoftext|>`` as pad). Words
    split at whitespace only, so that a word may hold punctuation (``Answer:``); an unknown word reads as the
    first one."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(words)) != WORDS:
        raise ValueError(f"chatml_tokenizer needs {WORDS} distinct words, got {len(set(words))}")
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({"\n": NEWLINE, "<|im_end|>": IM_END, "<|endoftext|>": PAD})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True), AddedToken("<|endoftext|>", special=True),
                            AddedToken("\n", special=False, normalized=False)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}{{ m['content'] }}<|im_end|>\n{% endfor %}")
    return fast


VLLM_HEAD_DIM = 32  # vLLM's CPU attention refuses the tiny default of 16

# Small enough for a 2-core CPU, shaped so that every layout of the tests is legal:
# 4 KV groups (TP 1/2/4), 8 experts (EP 1/2/4/8), expert ffn 32 (ETP 1/2/4), 4 layers (PP 1/2/4).
TINY_MOE = dict(
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    router_aux_loss_coef=0.001,
    hidden_act="silu",
    attention_bias=False,
    initializer_range=0.05,
)

TINY_DENSE = {k: v for k, v in TINY_MOE.items() if not k.startswith(("num_experts", "moe_", "norm_topk", "decoder_sparse", "mlp_only", "router_"))}
TINY_DENSE.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])


def make_tiny_model(out: str | Path, *, seed: int = 0, dtype: str = "float32", **overrides) -> Path:
    """Write a seeded random tiny model as an HF folder (config.json + safetensors). Returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out)
    base = dict(TINY_DENSE if overrides.get("model_type") == "qwen3" else TINY_MOE)
    base.update(overrides)
    model_type = base.pop("model_type")
    base.pop("architectures", None)
    config = AutoConfig.for_model(model_type, **base)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    # Norm weights start at one in HF; randomise them so that a swapped or unloaded norm shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_truncated_model(out: str | Path, like: str | Path, layers: int, *, seed: int = 0,
                         dtype: str = "bfloat16") -> Path:
    """A model of the real width of ``like`` (a model folder or config.json) with only ``layers`` layers and
    seeded random weights: the shapes of the real tensors, a few GB instead of the whole model, no download."""
    from mcore_dapo.bridge.hf_config import config_path

    raw = json.loads(config_path(like).read_text())
    keep = {k: v for k, v in raw.items() if k not in ("architectures", "transformers_version", "torch_dtype", "dtype")}
    keep.update(num_hidden_layers=layers, initializer_range=0.02)
    return make_tiny_model(out, seed=seed, dtype=dtype, **keep)


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
    """``python -m mcore_dapo.harness.tiny reference HF_DIR OUT.pt``: HF logits in a clean process;
    ``... model DIR [--like CONFIG --layers N]``: a tiny model, or a truncated real-width one."""
    import argparse

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["model", "reference"])
    ap.add_argument("path")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4,
                    help="with 'reference': sequences, split over the data-parallel ranks of harness.logits")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--like", default=None, help="with 'model': the real width of this config, --layers layers")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--padded-vocab", type=int, default=None,
                    help="with 'reference': the training loss's gradients over this many logits (zero rows past the vocabulary)")
    a = ap.parse_args(argv)
    if a.what == "model":
        if a.like:
            make_truncated_model(a.path, a.like, a.layers, seed=a.seed)
        else:
            make_tiny_model(a.path, seed=a.seed)
        return 0
    vocab = json.loads((Path(a.path) / "config.json").read_text())["vocab_size"]
    b = tiny_batch(vocab, a.batch, a.seq)
    # the training loss of harness.logits --backward: next-token labels, a token-mean over the batch's loss mask
    loss, grads = hf_reference_grads(a.path, b["tokens"], b["labels"], a.padded_vocab, b["attention_mask"],
                                     b["loss_mask"])
    torch.save({**b, "logits": hf_reference_logits(a.path, b["tokens"], a.dtype, b["attention_mask"]),
                "loss": loss, "grads": grads, "padded_vocab": a.padded_vocab}, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
