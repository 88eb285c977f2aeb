"""A console script's function run in the test's process, its output and exit code as a finished process's: its
launches start as the suite's do (tests/conftest.py, LAUNCHES), where a process of its own would start torchrun."""

from __future__ import annotations

import contextlib
import io
import types


def run_cli(main, *args) -> types.SimpleNamespace:
    """``main([str(a) for a in args])`` with stdout and stderr captured: ``returncode`` (argparse's refusals exit
    with SystemExit: its code), ``stdout``, ``stderr``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
