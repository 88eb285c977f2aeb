"""Check a DAPO data file (the guide's ``TRAIN_FILE`` / ``TEST_FILE``) against what verl 0.9.1 reads.

verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``) loads a file whose name ends in
``.parquet`` with ``datasets``, hands ``prompt`` (a list of ``{role, content}`` messages) to the
chat template, and reads ``extra_info.index``; the ``dapo`` reward manager passes ``data_source``,
the decoded response and ``reward_model.ground_truth`` to verl's ``default_compute_score``
(``verl/utils/reward_score/__init__.py``), which picks the scorer by ``data_source`` (``math_dapo``
for ``math_dapo``, ``math``, ``math_dapo_reasoning`` and every ``aime*``) and raises for a source it
does not know. ``math_dapo`` normalises the ground truth as a string.

Prompt lengths are counted as verl counts them: the chat template applied with a generation prompt,
then tokenized. verl 0.9.1 does not read ``data.truncation``: its agent loop keeps the last
``rollout.prompt_length`` (= ``data.max_prompt_length``) tokens of a longer prompt, which is what
``data.truncation=left`` asks; with ``data.filter_overlong_prompts=True`` the dataset drops them
instead.
"""

from __future__ import annotations

import math
from pathlib import Path

from mcore_dapo.errors import UserError

# verl 0.9.1, verl/utils/reward_score/__init__.py, default_compute_score: the sources it scores
DEFAULT_REWARD_SOURCES = frozenset({
    "openai/gsm8k", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
    "math_dapo", "math", "math_dapo_reasoning", "numina_aops_forum", "numina_synthetic_math",
    "numina_amc_aime", "numina_synthetic_amc", "numina_cn_k12", "numina_olympiads", "codecontests", "apps",
    "codeforces", "taco", "hiyouga/geometry3k", "searchR1_nq", "searchR1_triviaqa", "searchR1_popqa",
    "searchR1_hotpotqa", "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"})
DEFAULT_REWARD_PREFIXES = ("aime",)
REQUIRED = ("data_source", "prompt", "reward_model")  # what verl's DAPO path reads
ALSO_IN_DAPO = ("ability", "extra_info")  # in the guide's files; verl does not need them
ROLES = ("system", "user", "assistant", "tool")
GUIDE_MAX_PROMPT = 2048  # data.max_prompt_length of configs/dapo/common.sh


def routes_to_default_reward(data_source: str) -> bool:
    """Whether verl 0.9.1's ``default_compute_score`` scores rows of this ``data_source``."""
    return data_source in DEFAULT_REWARD_SOURCES or data_source.startswith(DEFAULT_REWARD_PREFIXES)


def read(path):
    """The file as a pyarrow table; a one-line :class:`UserError` for a missing or unreadable file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if not path.is_file():
        raise UserError(f"{path}: not a file")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: not a parquet file ({first})") from None


def _is_string(t) -> bool:
    import pyarrow.types as pt

    return pt.is_string(t) or pt.is_large_string(t)


def _is_list(t) -> bool:
    import pyarrow.types as pt

    return pt.is_list(t) or pt.is_large_list(t)


def _field(struct_type, name):
    i = struct_type.get_field_index(name)
    return struct_type.field(i).type if i >= 0 else None


class Problems:
    """Problems per column: the first bad row, how many rows, what is wrong."""

    def __init__(self):
        self.items: list[dict] = []

    def add(self, column: str, what: str, rows: list[int] | None = None) -> None:
        self.items.append({"column": column, "row": rows[0] if rows else None, "rows": len(rows) if rows else None,
                           "what": what})

    @staticmethod
    def line(p: dict) -> str:
        where = f"column '{p['column']}'" + (f", row {p['row']}" if p["row"] is not None else "")
        more = f" ({p['rows']} rows)" if p["rows"] and p["rows"] > 1 else ""
        return f"{where}: {p['what']}{more}"


def _rows_where(values, bad) -> list[int]:
    return [i for i, v in enumerate(values) if bad(v)]


def _check_data_source(col, problems: Problems, custom_reward: bool) -> None:
    if not _is_string(col.type):
        problems.add("data_source", f"type {col.type}, not a string (verl's reward picks its scorer by this string)", [0])
        return
    values = col.to_pylist()
    if rows := _rows_where(values, lambda v: not v):
        problems.add("data_source", "empty", rows)
    if not custom_reward:
        unknown = _rows_where(values, lambda v: bool(v) and not routes_to_default_reward(v))
        if unknown:
            names = sorted({values[i] for i in unknown})
            problems.add("data_source", f"{', '.join(map(repr, names[:3]))}{' ...' if len(names) > 3 else ''}: "
                         "verl's default reward (default_compute_score) does not know it and raises (math_dapo "
                         "scores 'math_dapo' and 'aime*'; --custom-reward if the run sets "
                         "reward.custom_reward_function)", unknown)


def _check_prompt(col, problems: Problems) -> None:
    t = col.type
    item = t.value_type if _is_list(t) else None
    if item is None or not hasattr(item, "get_field_index"):
        problems.add("prompt", f"type {t}, not a list of {{role, content}} messages (verl applies the chat "
                     "template to a list of messages)", [0])
        return
    missing = [f for f in ("role", "content") if _field(item, f) is None]
    if missing:
        problems.add("prompt", f"messages without {' and '.join(missing)} (type {t}): verl's messages are "
                     "{role, content}", [0])
        return
    for f in ("role", "content"):
        if not _is_string(_field(item, f)):
            problems.add("prompt", f"message {f} of type {_field(item, f)}, not a string", [0])
            return
    values = col.to_pylist()
    if rows := _rows_where(values, lambda v: not v):
        problems.add("prompt", "no messages (null or an empty list)", rows)
    if rows := _rows_where(values, lambda v: bool(v) and any(m is None or m["role"] not in ROLES for m in v)):
        problems.add("prompt", f"a message whose role is not one of {', '.join(ROLES)}", rows)
    if rows := _rows_where(values, lambda v: bool(v) and any(m is not None and m["content"] is None for m in v)):
        problems.add("prompt", "a message without content", rows)


def _check_reward_model(col, problems: Problems) -> None:
    t = col.type
    if not hasattr(t, "get_field_index"):
        problems.add("reward_model", f"type {t}, not a struct {{ground_truth, style}}", [0])
        return
    gt = _field(t, "ground_truth")
    if gt is None:
        problems.add("reward_model", f"no ground_truth field (type {t}): the reward manager reads "
                     "reward_model.ground_truth", [0])
        return
    if not _is_string(gt):
        problems.add("reward_model", f"ground_truth of type {gt}, not a string (math_dapo normalises it as a string)",
                     [0])
        return
    values = col.to_pylist()
    if rows := _rows_where(values, lambda v: v is None or not v.get("ground_truth")):
        problems.add("reward_model", "no ground_truth (null or empty)", rows)


def _check_extra_info(col, problems: Problems) -> None:
    import pyarrow.types as pt

    if not (hasattr(col.type, "get_field_index") or pt.is_null(col.type)):
        problems.add("extra_info", f"type {col.type}, not a struct (verl's dataset reads extra_info.index from it)",
                     [0])


def schema_problems(table, custom_reward: bool = False) -> tuple[list[dict], list[str]]:
    """(problems, warnings): each problem names its column and first bad row; warnings do not stop a run."""
    problems, warnings = Problems(), []
    names = table.column_names
    for c in REQUIRED:
        if c not in names:
            problems.add(c, "missing (verl's DAPO path reads it)")
    for c in ALSO_IN_DAPO:
        if c not in names:
            warnings.append(f"column '{c}' missing: the guide's files have it; verl does not need it")
    checks = {"data_source": lambda col: _check_data_source(col, problems, custom_reward),
              "prompt": lambda col: _check_prompt(col, problems),
              "reward_model": lambda col: _check_reward_model(col, problems),
              "extra_info": lambda col: _check_extra_info(col, problems)}
    for c in names:  # in the file's order: the first problem is the first bad column
        if c in checks:
            checks[c](table.column(c).combine_chunks())
        elif c == "ability" and not _is_string(table.schema.field(c).type):
            warnings.append(f"column 'ability' of type {table.schema.field(c).type}: a string in the guide's files")
    order = {c: i for i, c in enumerate(names)}
    problems.items.sort(key=lambda p: (p["column"] in order, order.get(p["column"], -1)))
    return problems.items, warnings


def percentiles(lengths: list[int]) -> dict:
    """Nearest-rank p50 / p90 / p99 and the maximum."""
    if not lengths:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    s = sorted(lengths)
    rank = lambda p: s[max(0, math.ceil(p / 100 * len(s)) - 1)]  # noqa: E731
    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": s[-1]}


def load_tokenizer(path):
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise UserError(f"--tokenizer {path}: not a folder (a model or tokenizer folder is)")
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise UserError(f"--tokenizer {path}: no tokenizer loads from it ({str(e).strip().splitlines()[0]})") from None
    if not getattr(tok, "chat_template", None):
        raise UserError(f"--tokenizer {path}: no chat template (verl applies the tokenizer's chat template)")
    return tok


def prompt_token_lengths(messages: list[list[dict]], tok, chat_template_kwargs: dict | None = None,
                         batch: int = 1024) -> list[int]:
    """Tokens per prompt as verl counts them: ``apply_chat_template(messages, add_generation_prompt=True)``
    rendered, then tokenized without special tokens (what ``tokenize=True`` does), in batches."""
    out = []
    for i in range(0, len(messages), batch):
        texts = tok.apply_chat_template(messages[i:i + batch], add_generation_prompt=True, tokenize=False,
                                        **(chat_template_kwargs or {}))
        out += [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    return out


def check(path, tokenizer=None, max_prompt_length: int | None = None, custom_reward: bool = False,
          on_schema=None) -> dict:
    """The report of ``mcore-dapo data check``. Schema problems raise a :class:`UserError` naming the first
    bad column and row, after ``on_schema(report)`` has seen them; nothing else is computed then."""
    if max_prompt_length is not None and tokenizer is None:
        raise UserError("--max-prompt-length counts tokens: it needs --tokenizer (the model's folder)")
    if max_prompt_length is not None and max_prompt_length < 1:
        raise UserError(f"--max-prompt-length={max_prompt_length} is not accepted: a positive number of tokens is")
    path = Path(path)
    table = read(path)
    problems, warnings = schema_problems(table, custom_reward)
    if path.suffix != ".parquet":
        problems.insert(0, {"column": None, "row": None, "rows": None,
                            "what": f"file name ends in {path.suffix or 'nothing'!r}: verl's RLHFDataset reads parquet "
                                    "only from a name ending in .parquet"})
    report = {"file": str(path), "rows": table.num_rows,
              "columns": {f.name: str(f.type) for f in table.schema}, "problems": problems, "warnings": warnings}
    if table.num_rows == 0:
        problems.append({"column": None, "row": None, "rows": None, "what": "no rows"})
    if problems:
        if on_schema:
            on_schema(report)
        first = problems[0]
        line = Problems.line(first) if first["column"] else first["what"]
        more = len(problems) - 1
        raise UserError(f"{path}: {line}" + (f"; {more} more problem{'s' if more > 1 else ''} listed above" if more else ""))
    sources = table.column("data_source").to_pylist()
    counts: dict = {}
    for s in sources:
        counts[s] = counts.get(s, 0) + 1
    report["data_sources"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    messages = table.column("prompt").to_pylist()
    if tokenizer is None:
        report["prompt_length"] = {"unit": "characters of content", **percentiles(
            [sum(len(m["content"]) for m in ms) for ms in messages])}
        return report
    tok = load_tokenizer(tokenizer)
    lengths = prompt_token_lengths(messages, tok)
    limit = max_prompt_length or GUIDE_MAX_PROMPT
    over = [i for i, n in enumerate(lengths) if n > limit]
    report["prompt_length"] = {"unit": "tokens", **percentiles(lengths)}
    report["max_prompt_length"] = limit
    report["over_max_prompt_length"] = len(over)
    report["first_over"] = over[0] if over else None
    return report


def render(report: dict) -> str:
    lines = [f"{report['file']}: {report['rows']} rows",
             "columns: " + ", ".join(f"{k} ({v})" for k, v in report["columns"].items())]
    lines += [f"problem: {Problems.line(p) if p['column'] else p['what']}" for p in report["problems"]]
    lines += [f"warning: {w}" for w in report["warnings"]]
    if "data_sources" in report:
        lines.append("data_source: " + ", ".join(
            f"{k} {v}" + ("" if routes_to_default_reward(k) else " (not verl's default reward)")
            for k, v in report["data_sources"].items()))
    if "prompt_length" in report:
        pl = report["prompt_length"]
        lines.append(f"prompt length ({pl['unit']}): p50 {pl['p50']}, p90 {pl['p90']}, p99 {pl['p99']}, max {pl['max']}")
        if pl["unit"] != "tokens":
            lines.append("(tokens and truncation: --tokenizer MODEL_DIR)")
    if "max_prompt_length" in report:
        n, limit = report["over_max_prompt_length"], report["max_prompt_length"]
        lines.append(f"over data.max_prompt_length={limit}: {n} prompt(s)"
                     + (f", first at row {report['first_over']}: verl keeps their last {limit} tokens "
                        "(data.truncation=left; data.filter_overlong_prompts=True drops them)" if n else ""))
    return "\n".join(lines)
