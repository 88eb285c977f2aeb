"""``mcore-dapo data check FILE``: the report on a good file, one line (exit 2) for a bad one."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mcore_dapo.cli.main import run
from mcore_dapo_checks import math_task


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data_check")
    files = math_task.write_files(d)
    math_task.tokenizer().save_pretrained(d / "tok")
    return {**files, "tok": d / "tok", "dir": d}


def check(capsys, *args):
    rc = run(["data", "check", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_good_file_report(data, capsys):
    rc, out, err = check(capsys, data["train"], "--json")
    assert rc == 0 and not err
    r = json.loads(out)
    assert r["rows"] == math_task.TRAIN_ROWS and r["problems"] == [] and r["warnings"] == []
    assert r["data_sources"] == {"math_dapo": math_task.TRAIN_ROWS}
    assert r["prompt_length"]["unit"] == "characters of content" and "over_max_prompt_length" not in r
    rc, out, err = check(capsys, data["val"], "--tokenizer", data["tok"], "--max-prompt-length", 11)
    assert rc == 0 and not err
    assert f"{math_task.VAL_ROWS} rows" in out
    assert "prompt length (tokens): p50 12, p90 12, p99 12, max 12" in out
    assert f"over data.max_prompt_length=11: {math_task.VAL_ROWS} prompt(s), first at row 0" in out
    rc, out, _ = check(capsys, data["val"], "--tokenizer", data["tok"], "--json")
    assert json.loads(out)["max_prompt_length"] == 2048 and json.loads(out)["over_max_prompt_length"] == 0


def test_token_lengths_are_verls(data):
    from transformers import AutoTokenizer
    from verl.utils.tokenizer import normalize_token_ids

    from mcore_dapo.data_check import prompt_token_lengths

    tok = AutoTokenizer.from_pretrained(str(data["tok"]))
    messages = pq.read_table(data["train"]).column("prompt").to_pylist()
    messages[0] = [{"role": "system", "content": "t1 t2"}, *messages[0]]
    # what RLHFDataset.maybe_filter_out_long_prompts counts, one prompt at a time
    verl = [len(normalize_token_ids(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True)))
            for m in messages]
    assert prompt_token_lengths(messages, tok, batch=7) == verl and verl[0] == verl[1] + 4  # t1 t2 <|im_end|> \n


def _write(path, rows, schema=None):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _rows(n=4):
    return math_task.rows(n, 0, "math_dapo", "train")


def _bad(kind):
    rows = _rows()
    if kind == "no reward_model":
        return [{k: v for k, v in r.items() if k != "reward_model"} for r in rows]
    if kind == "prompt string":
        return [{**r, "prompt": r["prompt"][0]["content"]} for r in rows]
    if kind == "no ground_truth":
        return [{**r, "reward_model": {"style": "rule"}} for r in rows]
    if kind == "int ground_truth":
        return [{**r, "reward_model": {"ground_truth": 1, "style": "rule"}} for r in rows]
    if kind == "role":
        rows[3]["prompt"] = [{"role": "bot", "content": "t1"}]
    if kind == "empty ground_truth":
        rows[2]["reward_model"] = {"ground_truth": "", "style": "rule"}
    if kind == "data_source":
        for r in rows[1:]:
            r["data_source"] = "tiny_parity"
    if kind == "extra_info string":
        return [{**r, "extra_info": "x"} for r in rows]
    return rows


@pytest.mark.parametrize("kind, line", [
    ("no reward_model", "column 'reward_model': missing (verl's DAPO path reads it)"),
    ("prompt string", "column 'prompt', row 0: type string, not a list of {role, content} messages"),
    ("no ground_truth", "column 'reward_model', row 0: no ground_truth field"),
    ("int ground_truth", "column 'reward_model', row 0: ground_truth of type int64, not a string"),
    ("role", "column 'prompt', row 3: a message whose role is not one of system, user, assistant, tool"),
    ("empty ground_truth", "column 'reward_model', row 2: no ground_truth (null or empty)"),
    ("data_source", "column 'data_source', row 1: 'tiny_parity': verl's default reward (default_compute_score) "
     "does not know it"),
    ("extra_info string", "column 'extra_info', row 0: type string, not a struct"),
])
def test_wrong_schema_is_one_line(tmp_path, capsys, kind, line):
    path = _write(tmp_path / "bad.parquet", _bad(kind))
    # a tokenizer that would fail to load: the schema is refused before it is looked at
    rc, out, err = check(capsys, path, "--tokenizer", tmp_path / "no-such-model")
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: {line}"), err
    assert f"problem: {line}" in out and "prompt length" not in out


def test_custom_reward_accepts_any_source(tmp_path, capsys):
    path = _write(tmp_path / "parity.parquet", _bad("data_source"))
    assert check(capsys, path)[0] == 2
    rc, out, _ = check(capsys, path, "--custom-reward")
    assert rc == 0 and "tiny_parity 3 (not verl's default reward)" in out


def test_missing_optional_columns_warn(tmp_path, capsys):
    path = _write(tmp_path / "lean.parquet", [{k: r[k] for k in ("data_source", "prompt", "reward_model")}
                                              for r in _rows()])
    rc, out, _ = check(capsys, path)
    assert rc == 0 and "warning: column 'ability' missing" in out and "warning: column 'extra_info' missing" in out


def test_file_errors_are_one_line(data, tmp_path, capsys):
    (tmp_path / "notes.parquet").write_text("not parquet\n")
    (tmp_path / "train.json").write_bytes(data["train"].read_bytes())
    cases = [(tmp_path / "absent.parquet", "no such file"), (tmp_path / "notes.parquet", "not a parquet file ("),
             (tmp_path, "not a file"),
             (tmp_path / "train.json", "file name ends in '.json': verl's RLHFDataset reads parquet only from a "
              "name ending in .parquet")]
    for path, what in cases:
        rc, _, err = check(capsys, path)
        assert rc == 2 and err.count("\n") == 1 and err.startswith(f"error: {path}: {what}"), err
    rc, out, err = check(capsys, data["train"], "--max-prompt-length", 8)
    assert rc == 2 and err == "error: --max-prompt-length counts tokens: it needs --tokenizer (the model's folder)\n"
    rc, _, err = check(capsys, data["train"], "--tokenizer", tmp_path / "nothing")
    assert rc == 2 and err.startswith("error: --tokenizer") and err.count("\n") == 1


def test_command_line(data, tmp_path):
    out = subprocess.run([sys.executable, "-m", "mcore_dapo.cli.main", "data", "check", str(tmp_path / "x.parquet")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr == f"error: {tmp_path / 'x.parquet'}: no such file\n"


def test_default_reward_sources_are_verls():
    from verl.utils.reward_score import default_compute_score

    from mcore_dapo.data_check import routes_to_default_reward

    for source in ("math_dapo", "math", "math_dapo_reasoning", "aime-2024", "aime_tiny"):
        assert routes_to_default_reward(source)
        assert default_compute_score(source, "Answer: 7", "7")["score"] == 1.0
    for source in ("tiny_parity", "dapo_math", "AIME"):
        assert not routes_to_default_reward(source)
        with pytest.raises(NotImplementedError):
            default_compute_score(source, "Answer: 7", "7")
