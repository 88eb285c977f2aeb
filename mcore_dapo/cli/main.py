"""``mcore-dapo``: env, demo, plan, metrics, compare, sync-bench."""

from __future__ import annotations

import argparse
import json
import sys

from mcore_dapo.cli import user_errors


def _env(a) -> int:
    from mcore_dapo import env

    info = env.collect(a.device)
    print(json.dumps(info, indent=1) if a.json else env.render(info))
    return 0


def _demo(a) -> int:
    from mcore_dapo import demo

    return demo.main(a.workdir, a.json)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mcore-dapo", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env", help="device, package versions and the patches that apply here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", choices=["cuda", "npu", "cpu"], default=None)
    p.set_defaults(fn=_env)
    p = sub.add_parser("demo", help="run the main job on an embedded tiny model on the CPU")
    p.add_argument("--json", action="store_true")
    p.add_argument("--workdir", default=None, help="keep the generated model and results here")
    p.set_defaults(fn=_demo)
    from mcore_dapo.cli.analysis import add_commands as analysis_commands

    analysis_commands(sub)
    from mcore_dapo.cli.sync import add_commands as sync_commands

    sync_commands(sub)
    return ap


@user_errors
def run(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return a.fn(a)


def main(argv=None) -> int:
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
