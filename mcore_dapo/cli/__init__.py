"""Command-line entry points (thin: they parse, call library functions, print)."""

from __future__ import annotations

import functools
import sys

from mcore_dapo.errors import UserError


def user_errors(fn):
    """Print a :class:`UserError` as one line on stderr and exit 2; no traceback for user mistakes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
