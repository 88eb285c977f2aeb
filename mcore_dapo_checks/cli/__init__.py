"""The ``mcore-dapo`` commands of the verification package: ``demo``, ``selfcheck``, ``sync-bench``, ``tiny-dapo``.

:func:`add_commands` is registered under the ``mcore_dapo.commands`` entry point (pyproject.toml); the product's
CLI (:mod:`mcore_dapo.cli.main`) adds the commands it finds there, without importing this package by name.
"""

from __future__ import annotations

import json
import sys


def _demo(a) -> int:
    from mcore_dapo_checks import demo

    return demo.main(a.workdir, a.json)


def _selfcheck(a) -> int:
    from pathlib import Path

    from mcore_dapo_checks.cli.selfcheck import REAL_CONFIG, SelfCheck, markdown

    check = SelfCheck(a.device, a.nproc, Path(a.workdir), a.budget_s, a.layers, Path(a.config or REAL_CONFIG),
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    report = check.run()
    print(json.dumps(report) if a.json else markdown(report))
    return 0 if report["ok"] else 1


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on an embedded tiny model on the CPU")
    p.add_argument("--json", action="store_true")
    p.add_argument("--workdir", default=None, help="keep the generated model and results here")
    p.set_defaults(fn=_demo)
    p = sub.add_parser("selfcheck", help="prove this node: Megatron vs HF, conversion, export, a DAPO update")
    p.add_argument("--device", choices=["cuda", "npu", "cpu"], required=True)
    p.add_argument("--nproc", type=int, default=1, help="devices (processes) to use")
    p.add_argument("--workdir", required=True, help="model, checkpoints and the report (selfcheck.json/.md)")
    p.add_argument("--budget-s", type=float, default=600.0, help="steps that no longer fit are skipped")
    p.add_argument("--layers", type=int, default=2, help="layers of the real-width model on an accelerator")
    p.add_argument("--config", default=None, help="the real model's config.json (default: the shipped Qwen3-30B-A3B)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_selfcheck)
    from mcore_dapo_checks.cli.sync_bench import add_commands as sync_commands
    from mcore_dapo_checks.cli.tiny_dapo import add_commands as tiny_dapo_commands

    sync_commands(sub)
    tiny_dapo_commands(sub)
