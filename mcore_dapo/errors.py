"""User-facing errors.

A :class:`UserError` is a mistake in what the user asked for (a bad path, an
illegal layout, an unsupported model). The command-line entry points print it
as one line and exit with status 2, without a traceback. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input, reported as one line."""


def accepted(name: str, value, what: str) -> UserError:
    """``UserError("<name>=<value> is not accepted: <what>")``."""
    return UserError(f"{name}={value!r} is not accepted: {what}")
