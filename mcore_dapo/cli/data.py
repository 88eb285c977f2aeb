"""``mcore-dapo data check FILE``: a DAPO data file (the guide's TRAIN_FILE / TEST_FILE) against what
verl 0.9.1 reads (:mod:`mcore_dapo.data_check`). ``add_commands(sub)`` adds ``data`` to the main parser."""

from __future__ import annotations

import json


def _check(a) -> int:
    from mcore_dapo.data_check import check, render

    def on_schema(report):  # the problems, one a line, before the one-line error
        if a.json:
            print(json.dumps(report))
        else:
            print(render(report))

    report = check(a.file, a.tokenizer, a.max_prompt_length, a.custom_reward, on_schema=on_schema)
    print(json.dumps(report) if a.json else render(report))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("data", help="check a DAPO data file (parquet) against what verl reads")
    dsub = p.add_subparsers(dest="data_cmd", required=True)
    c = dsub.add_parser("check", help="rows, schema problems, prompt lengths and truncation of a parquet file")
    c.add_argument("file", metavar="FILE", help="a parquet file (data.train_files / data.val_files)")
    c.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="the model's folder: prompt lengths in its tokens, through its chat template")
    c.add_argument("--max-prompt-length", type=int, default=None, metavar="N",
                   help="data.max_prompt_length (default with --tokenizer: 2048, the scripts' value)")
    c.add_argument("--custom-reward", action="store_true",
                   help="the run sets reward.custom_reward_function: any data_source is accepted")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_check)
