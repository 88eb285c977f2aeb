"""Command-line entry points (thin: they parse, call library functions, print)."""

from __future__ import annotations

import functools
import sys

from mcore_dapo.errors import UserError


def user_errors(fn):
    """Print a :class:`UserError` as one line on stderr and exit 2; no traceback for user mistakes (one
    raised in a worker process, a Ray actor or vLLM's engine arrives as the same line). A launch of worker
    processes that failed otherwise is one line too, exit 1: the first failing rank's exception type and
    message and the path of the full log (:mod:`mcore_dapo.runtime.failures`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from mcore_dapo.runtime.failures import user_error_line
        from mcore_dapo.runtime.launch import LaunchError

        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {user_error_line(e)}", file=sys.stderr)
            return 2
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
