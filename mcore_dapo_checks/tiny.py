"""Generate tiny Qwen3 / Qwen3-MoE checkpoints with transformers (seeded, hub layout, safetensors)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# the forward check's batch and HF reference are the product's (mcore-convert verify runs them), used here too
from mcore_dapo.convert.hf_reference import (LENGTHS, PAD_ID, hf_reference_grads, hf_reference_logits,  # noqa: F401
                                             tiny_batch, tiny_prompts)

# the word-level ChatML tokenizer of the tiny trainer runs (tiny_dapo.py, math_task.py)
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


def main(argv=None) -> int:
    """``python -m mcore_dapo_checks.tiny model DIR [--like CONFIG --layers N]``: a tiny model, or a truncated
    real-width one; ``... reference HF_DIR OUT.pt [...]``: :mod:`mcore_dapo.convert.hf_reference`."""
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reference"]:
        from mcore_dapo.convert.hf_reference import main as reference

        return reference([*argv[1:], "--grads"])  # the checks compare gradients too (forward_check --backward)
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.tiny")
    ap.add_argument("what", choices=["model"])
    ap.add_argument("path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--like", default=None, help="the real width of this config, --layers layers")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="the weights' dtype (default: float32, bfloat16 with --like)")
    a = ap.parse_args(argv)
    dtype = {"dtype": a.dtype} if a.dtype else {}
    if a.like:
        make_truncated_model(a.path, a.like, a.layers, seed=a.seed, **dtype)
    else:
        make_tiny_model(a.path, seed=a.seed, **dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
