"""The math task: the guide's data schema, verl's RLHFDataset and math_dapo on it, and a taught tiny model
that is right part of the time (so that filter_groups keeps groups)."""

import pyarrow.parquet as pq
import pytest

from mcore_dapo_checks import math_task
from mcore_dapo_checks.tiny import IM_END, NEWLINE, PAD


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return math_task.prepare(tmp_path_factory.mktemp("math_task"))


def test_files_have_the_schema(files):
    for split, source in (("train", "math_dapo"), ("val", "aime_tiny")):
        schema = pq.read_schema(files[split])
        assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert schema.remove_metadata().equals(math_task.schema()), schema
        rows = pq.read_table(files[split]).to_pylist()
        assert len(rows) == (math_task.TRAIN_ROWS if split == "train" else math_task.VAL_ROWS)
        assert {r["data_source"] for r in rows} == {source}
        assert {r["ability"] for r in rows} == {"MATH"}
        assert all(len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user" for r in rows)
        assert {r["reward_model"]["style"] for r in rows} == {"rule-lighteval/MATH_v2"}
        assert {r["reward_model"]["ground_truth"] for r in rows} == {"0", "1"}
        assert len({r["extra_info"]["index"] for r in rows}) == len(rows)


def test_rlhf_dataset_loads_them(files, tmp_path):
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.utils.tokenizer import normalize_token_ids

    tok = AutoTokenizer.from_pretrained(str(files["model"]))
    assert (tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("\n")) == (IM_END, PAD, NEWLINE)
    config = OmegaConf.create({"max_prompt_length": 16, "filter_overlong_prompts": True, "truncation": "left",
                               "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path)})
    ds = RLHFDataset(str(files["train"]), tok, config)
    assert len(ds) == math_task.TRAIN_ROWS  # none longer than 16 tokens
    row = ds[0]
    assert row["index"] == "train-0" and row["data_source"] == "math_dapo"
    content = row["raw_prompt"][0]["content"]
    ids = normalize_token_ids(tok.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=True))
    assert ids == math_task.prompt_ids(content) and len(ids) == math_task.PROMPT_TOKENS
    assert tok.decode(ids, skip_special_tokens=True).strip() == content
    short = RLHFDataset(str(files["val"]), tok, OmegaConf.merge(config, {"max_prompt_length": 11}))
    assert len(short) == 0  # every prompt is 12 tokens


def test_math_dapo_scores_the_decoded_answer(files):
    from transformers import AutoTokenizer
    from verl.utils.reward_score import default_compute_score, math_dapo

    tok = AutoTokenizer.from_pretrained(str(files["model"]))
    response = tok.convert_tokens_to_ids(["Answer:", "1", "<|im_end|>"])
    text = tok.decode(response, skip_special_tokens=True)
    assert text == "Answer: 1"
    assert math_dapo.compute_score(text, "1")["score"] == 1.0
    assert math_dapo.compute_score(text, "0")["score"] == -1.0
    trailing = tok.decode(tok.convert_tokens_to_ids(["Answer:", "1", "t3"]), skip_special_tokens=True)
    assert math_dapo.compute_score(trailing, "1")["score"] == -1.0  # math_dapo takes the rest of the line
    for source in ("math_dapo", "aime_tiny"):  # the sources of both files reach math_dapo
        assert default_compute_score(source, text, "1") == {"score": 1.0, "acc": True, "pred": "1"}


def test_taught_model_is_right_part_of_the_time(files):
    r = math_task.sample_accuracy(files["model"], n_prompts=32, n=16)
    assert r["answer_form"] > 0.9, r
    assert 0.15 < r["accuracy"] < 0.85, r
    assert r["mixed"] >= 0.5, r
