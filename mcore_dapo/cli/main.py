"""``mcore-dapo``: env, plan, metrics, compare, data, migrate, scripts; and the commands of the verification
package (demo, selfcheck, sync-bench, tiny-dapo: ``mcore_dapo_checks``, shipped in the same distribution), which
registers them through the ``mcore_dapo.commands`` entry point: this package never imports it."""

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


def _scripts(a) -> int:
    import shutil

    from mcore_dapo.io.output import check_output, staged
    from mcore_dapo.resources import configs_dir

    out = check_output(a.dir, a.overwrite)
    src = configs_dir()
    with staged(out, a.overwrite) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    names = sorted(p.name for p in out.glob("*.sh"))
    print(f"wrote {out}: {', '.join(names)}, dapo/common.sh, models/ (the model's config for DRY_RUN=1)")
    print(f"check one without Ray or devices:  DRY_RUN=1 bash {out / 'dapo_qwen3_30b_h100.sh'}")
    return 0


def _migrate(a) -> int:
    from mcore_dapo import migrate

    return migrate.main(a)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mcore-dapo", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("env", help="device, package versions and the patches that apply here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", choices=["cuda", "npu", "cpu"], default=None)
    p.set_defaults(fn=_env)
    p = sub.add_parser("scripts", help="write the launch scripts (A2, H100, Ray start, common.sh, the model's "
                       "config) into DIR")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--overwrite", action="store_true", help="replace DIR when it exists")
    p.set_defaults(fn=_scripts)
    p = sub.add_parser("migrate", help="a verl FSDP launch (the guide's) as a verl 0.9.1 Megatron launch script")
    p.add_argument("script", metavar="SCRIPT", help="bash launch script, or a file of key=value overrides")
    p.add_argument("--out", default=None, metavar="FILE", help="write the script here (default: standard output)")
    p.add_argument("--device", default=None, help="the planner's device (default: from trainer.device: npu -> a2, "
                   "cuda -> h100); h100, h200, a100, a2")
    p.add_argument("--model", default=None, help="the model's folder or config.json for the planner (default: "
                   "actor_rollout_ref.model.path where it is on this machine, else Qwen3-30B-A3B's config)")
    p.add_argument("--json", action="store_true", help="print the overrides and differences as one JSON line")
    p.set_defaults(fn=_migrate)
    from mcore_dapo.cli.analysis import add_commands as analysis_commands

    analysis_commands(sub)
    from mcore_dapo.cli.data import add_commands as data_commands

    data_commands(sub)
    for add_commands in registered_commands():
        add_commands(sub)
    return ap


COMMANDS_GROUP = "mcore_dapo.commands"


def registered_commands() -> list:
    """The ``add_commands(subparsers)`` functions other packages register under the ``mcore_dapo.commands``
    entry point group (this distribution's verification package: demo, selfcheck, sync-bench, tiny-dapo)."""
    from importlib.metadata import entry_points

    return [ep.load() for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda ep: ep.name)]


@user_errors
def run(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return a.fn(a)


def main(argv=None) -> int:
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
