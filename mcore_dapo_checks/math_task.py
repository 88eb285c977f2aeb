"""A tiny task in the data schema of the guide's DAPO-Math-17k (train) and AIME-2024 (test) files, scored
by verl's own ``math_dapo`` reward (no custom reward function), that the tiny Qwen3-MoE solves part of
the time, so that dynamic sampling (``algorithm.filter_groups``) keeps groups.

``python -m mcore_dapo_checks.math_task --workdir W [--measure]``

The problem: six filler words, then ``d mod 2 ?`` with a digit ``d``; the answer, a string in
``reward_model.ground_truth``, is ``0`` or ``1``. A response is the words ``Answer: N``, which the
word-level tokenizer decodes to the string ``Answer: N``: verl's ``math_dapo`` reads the last
``Answer: ...`` (its Minerva pattern), +1 when it equals the ground truth, else -1, with ``acc`` for
filter_groups. Rows reach ``math_dapo.compute_score`` through verl's ``default_compute_score``:
``data_source`` is ``math_dapo`` in the train file and ``aime_tiny`` in the test file (verl routes
every ``aime*`` source to ``math_dapo``).

:func:`prepare` generates the model (the tiny config of :mod:`mcore_dapo_checks.tiny`, seeded) and
teaches it the answer form in a few seconds of plain supervised training on the CPU, on targets that
are right with probability :data:`P_TEACH` (0.5: independent of the prompt). Sampled at temperature
1 it answers ``Answer: 0`` or ``Answer: 1`` and is right about half the time, so nearly every group
of responses mixes right and wrong (what filter_groups keeps); the rule itself (the parity of ``d``)
is left for RL to learn. The tokenizer is :func:`mcore_dapo_checks.tiny.chatml_tokenizer`
(``<|im_end|>`` = eos = id 254, ``<|endoftext|>`` = pad = id 255, ``\\n`` = 253, its chat template);
the trainer runs of :mod:`mcore_dapo_checks.tiny_dapo` train on these files with verl's default reward.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

from mcore_dapo_checks.tiny import IM_END, NEWLINE, PAD, VLLM_HEAD_DIM, WORDS, chatml_tokenizer

FILLER = 6
DIGITS = [str(d) for d in range(10)]
ANSWER = "Answer:"
TASK_WORDS = [*DIGITS, "mod", "?", ANSWER]
# ids 0 .. 252: filler words t0 .. t239, then the task's words; 253 .. 255 as in tiny_dapo
VOCAB_WORDS = [f"t{i}" for i in range(WORDS - len(TASK_WORDS))] + TASK_WORDS
N_FILLER = WORDS - len(TASK_WORDS)
TRAIN_SOURCE, VAL_SOURCE = "math_dapo", "aime_tiny"
ABILITY, STYLE = "MATH", "rule-lighteval/MATH_v2"
TRAIN_ROWS, VAL_ROWS = 48, 16
PROMPT_TOKENS = FILLER + 4 + 2  # filler, d mod 2 ?, <|im_end|> \n (the chat template)
P_TEACH = 0.5  # the probability of the right answer in the taught targets: 0.5 teaches the form, not the task
TEACH_STEPS, TEACH_BATCH, TEACH_LR = 100, 32, 3e-3


def tokenizer():
    """The word-level ChatML tokenizer of tiny_dapo over this task's vocabulary."""
    return chatml_tokenizer(VOCAB_WORDS)


def problem(g) -> tuple[str, str]:
    """One problem from the torch generator ``g``: (the user message, the ground-truth digit)."""
    import torch

    filler = torch.randint(0, N_FILLER, (FILLER,), generator=g).tolist()
    d = int(torch.randint(0, 10, (), generator=g))
    return " ".join([*(f"t{x}" for x in filler), str(d), "mod", "2", "?"]), str(d % 2)


def rows(n: int, seed: int, data_source: str, split: str) -> list[dict]:
    """``n`` rows in the schema of the guide's DAPO-Math-17k / AIME-2024 parquet files."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        content, answer = problem(g)
        out.append({"data_source": data_source, "prompt": [{"role": "user", "content": content}],
                    "ability": ABILITY, "reward_model": {"ground_truth": answer, "style": STYLE},
                    "extra_info": {"index": f"{split}-{i}"}})
    return out


def schema():
    """The five columns of the DAPO-Math-17k rows that verl's DAPO recipe reads, typed as verl needs them:
    ``prompt`` a list of ``{role, content}`` messages (the chat template's input), ``reward_model`` a
    struct with a string ``ground_truth`` (math_dapo normalises a string), ``extra_info.index`` (the
    dataset's ``index``). ``style`` is not read by verl's default reward."""
    import pyarrow as pa

    return pa.schema([("data_source", pa.string()),
                      ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                      ("ability", pa.string()),
                      ("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
                      ("extra_info", pa.struct([("index", pa.string())]))])


def write_files(workdir: Path, train_rows: int = TRAIN_ROWS, val_rows: int = VAL_ROWS) -> dict:
    """``train.parquet`` (data_source ``math_dapo``) and ``val.parquet`` (``aime_tiny``) in ``workdir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {"train": workdir / "train.parquet", "val": workdir / "val.parquet"}
    pq.write_table(pa.Table.from_pylist(rows(train_rows, 11, TRAIN_SOURCE, "train"), schema=schema()), files["train"])
    pq.write_table(pa.Table.from_pylist(rows(val_rows, 12, VAL_SOURCE, "test"), schema=schema()), files["val"])
    return files


_IDS = {w: i for i, w in enumerate(VOCAB_WORDS)}


def prompt_ids(content: str) -> list[int]:
    """The prompt's ids as verl's agent loop builds them from the chat template (``content<|im_end|>\\n``;
    the template adds no generation prompt), without rendering the template per sample."""
    return [_IDS[w] for w in content.split()] + [IM_END, NEWLINE]


def teach(model_dir: Path, steps: int = TEACH_STEPS, seed: int = 0, p_right: float = P_TEACH) -> dict:
    """Supervised training of the model in ``model_dir`` (in place) on prompt -> ``Answer: N <|im_end|>``,
    N the right answer with probability ``p_right``, the other one otherwise; the loss on the response only.
    Seeded; returns the number of steps, the seconds and the first and last losses."""
    import torch
    from transformers import AutoModelForCausalLM

    digit_id, answer_id = {d: _IDS[d] for d in DIGITS}, _IDS[ANSWER]
    g = torch.Generator().manual_seed(1000 + seed)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=TEACH_LR, weight_decay=0.0)
    t0, losses = time.time(), []
    with _one_thread():
        _teach_steps(model, opt, g, steps, p_right, answer_id, digit_id, losses)
    model.eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    return {"steps": steps, "seconds": round(time.time() - t0, 1), "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None}


def _teach_steps(model, opt, g, steps, p_right, answer_id, digit_id, losses) -> None:
    import torch

    for _ in range(steps):
        batch = []
        for _ in range(TEACH_BATCH):
            content, answer = problem(g)
            if torch.rand((), generator=g).item() >= p_right:
                answer = str(1 - int(answer))
            batch.append(prompt_ids(content) + [answer_id, digit_id[answer], IM_END])
        ids = torch.tensor(batch)
        logits = model(input_ids=ids).logits[:, PROMPT_TOKENS - 1:-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ids[:, PROMPT_TOKENS:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())


@contextlib.contextmanager
def _one_thread():
    """A tiny model runs faster on one thread than on several of a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def prepare(workdir: Path, rollout: str = "hf_cpu", teach_steps: int = TEACH_STEPS, p_right: float = P_TEACH,
            layers: int = 4, rollout_tp: int = 1) -> dict:
    """Model (taught, with the tokenizer) and the two data files in ``workdir``:
    ``{"model": W/math-qwen3-moe, "train": W/train.parquet, "val": W/val.parquet}``. ``p_right``: the share of
    right answers in the taught targets (above 0.5 teaches part of the rule: a head start for RL); ``layers``:
    the model's decoder layers (8 for the A2 layout class's uneven pipeline stages); ``rollout_tp``: the vLLM
    rollout's tensor-parallel size (vLLM's CPU MoE kernel takes an expert width of 32 per rank on weight
    updates: the experts are 32 wide per rank)."""
    from mcore_dapo_checks.tiny import make_tiny_model

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / "math-qwen3-moe"
    shutil.rmtree(model, ignore_errors=True)  # generated anew (seeded), never a stale copy
    extra = {"head_dim": VLLM_HEAD_DIM, "moe_intermediate_size": 32 * rollout_tp} if rollout == "vllm" else {}
    extra["num_hidden_layers"] = layers
    # no pad_token_id in the config: transformers would zero that embedding row and freeze it (padding_idx),
    # Megatron trains every row (docs/VERL_PLUGIN.md: what the audit found)
    make_tiny_model(model, seed=0, eos_token_id=IM_END, bos_token_id=None, **extra)
    teach(model, teach_steps, p_right=p_right)
    tokenizer().save_pretrained(model)
    return {"model": model, **write_files(workdir)}


def sample_accuracy(model_dir: Path, n_prompts: int = 32, n: int = 16, seed: int = 0,
                    max_new_tokens: int = 6) -> dict:
    """Sample ``n`` responses per prompt at temperature 1 (top_p 1, no top-k, as the DAPO rollout) with
    HF generate, decode them as verl's reward manager does and score them with verl's math_dapo.
    ``accuracy``: the mean of math_dapo's ``acc``; ``mixed``: the fraction of prompts whose ``n``
    scores are not all equal (the groups filter_groups keeps)."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl.utils.reward_score import default_compute_score

    tok = tokenizer()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    problems = rows(n_prompts, 100 + seed, TRAIN_SOURCE, "measure")
    ids = torch.tensor([prompt_ids(r["prompt"][0]["content"]) for r in problems for _ in range(n)])
    torch.manual_seed(seed)
    with torch.no_grad(), _one_thread():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                             eos_token_id=IM_END, pad_token_id=PAD)
    responses = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = row.index(IM_END) + 1 if IM_END in row else len(row)  # the valid response, eos included
        responses.append(tok.decode(row[:cut], skip_special_tokens=True))
    acc = []
    for i, text in enumerate(responses):
        r = problems[i // n]
        acc.append(float(default_compute_score(r["data_source"], text, r["reward_model"]["ground_truth"])["acc"]))
    groups = [acc[i * n:(i + 1) * n] for i in range(n_prompts)]
    return {"accuracy": sum(acc) / len(acc), "mixed": sum(len(set(gr)) > 1 for gr in groups) / n_prompts,
            "answer_form": sum(t.startswith(ANSWER + " ") for t in responses) / len(responses),
            "prompts": n_prompts, "n": n, "examples": responses[:4]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcore_dapo_checks.math_task")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rollout", choices=["hf_cpu", "vllm"], default="hf_cpu")
    ap.add_argument("--teach-steps", type=int, default=TEACH_STEPS)
    ap.add_argument("--measure", action="store_true",
                    help="sample the taught model (16 per prompt, 32 prompts, temperature 1) and score with math_dapo")
    a = ap.parse_args(argv)
    t0 = time.time()
    files = prepare(Path(a.workdir).absolute(), a.rollout, a.teach_steps)
    result = {k: str(v) for k, v in files.items()}
    result["prepare_seconds"] = round(time.time() - t0, 1)
    if a.measure:
        result.update(sample_accuracy(files["model"]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
