"""What a failed run of worker processes tells the user: the first failing rank's error, in one line.

* A torchrun worker (:func:`mcore_dapo.runtime.launch.worker_main`) that fails writes a record into the
  folder named by ``$MCORE_DAPO_FAILURES`` (made by the launcher): its rank, the time, and either the
  line of a :class:`UserError` or an unexpected exception's type, message and traceback.
* A :class:`UserError` raised further down, in a Ray actor or in vLLM's engine process, reaches the
  worker wrapped: Ray's ``RayTaskError`` holds it as ``cause``; other wrappers carry the traceback's text,
  whose last line Python writes as ``mcore_dapo.errors.UserError: <line>``. Where the wrapper lost it
  (vLLM's ``EngineDeadError``), the line is read from the processes' output log.

:func:`summarize` turns records and log into the one line: a user mistake found anywhere is the line
itself (the ranks that fail after it fail because of it); otherwise the earliest failing rank's exception
type and message, with the path of the full log.
"""

from __future__ import annotations

import json
import os
import re
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from mcore_dapo.errors import UserError

ENV = "MCORE_DAPO_FAILURES"
USER_ERROR_LINE = re.compile(r"mcore_dapo\.errors\.UserError: (.+?)\s*$", re.MULTILINE)
EXCEPTION_LINE = re.compile(r"^(?:\[rank(\d+)\]: |\S+ )?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Timeout)\w*): "
                            r"(.+?)\s*$", re.MULTILINE)  # torchrun prefixes a rank's traceback with [rankN]:
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def user_error_line(exc: BaseException | None) -> str | None:
    """The one line of the :class:`UserError` that ``exc`` is or wraps (Ray's ``cause``, ``__cause__``,
    ``__context__``, or a traceback's text in the message); None when it holds none."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError: the actor's own exception
        if isinstance(cause, BaseException):
            exc = cause
            continue
        if isinstance(exc, UserError):
            return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        found = user_error_in_text(str(exc))
        if found:
            return found
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)  # `from None`: not it
    return None


def user_error_in_text(text: str) -> str | None:
    """The first ``mcore_dapo.errors.UserError: <line>`` in ``text`` (a log, a traceback), None if there is none."""
    m = USER_ERROR_LINE.search(ANSI.sub("", text))
    return m.group(1) if m else None


def innermost(exc: BaseException) -> BaseException:
    """The exception ``exc`` wraps deepest: Ray's ``cause`` (an actor's own exception), else ``__cause__``."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)
        inner = inner if isinstance(inner, BaseException) else exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def exception_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of the exception ``exc`` wraps deepest."""
    inner = innermost(exc)
    message = str(inner).strip()
    return f"{type(inner).__name__}: {message.splitlines()[0] if message else ''}".rstrip(": ")


def exception_in_text(text: str, last: bool = False) -> str | None:
    """``[rank N: ]Type: message`` of the first (``last``: the last) traceback's exception in ``text``, None
    when there is none. The last of a process's log is its own uncaught exception; in it, the innermost
    exception a Ray error carries (its remote traceback's last line)."""
    text = ANSI.sub("", text)
    marker = "Traceback (most recent call last):"
    start = text.rfind(marker) if last else text.find(marker)
    if start < 0:
        return None
    m = EXCEPTION_LINE.search(text, start)
    if m and not _bare_exception(text, start, before=m.start()):
        return f"{f'rank {m.group(1)}: ' if m.group(1) else ''}{m.group(2).rsplit('.', 1)[-1]}: {m.group(3)}"
    bare = _bare_exception(text, start)
    if bare:
        return bare
    return None


RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
EXCEPTION_NAME = re.compile(r"^([A-Za-z_][\w.]*)(?::\s*(.*?))?\s*$")


def _bare_exception(text: str, start: int, before: int | None = None) -> str | None:
    """The exception line closing the traceback that starts at ``start``, also one without a message (``raise
    StopIteration``, ``KeyError: ''``); None if that traceback's last line is not one (or lies past ``before``)."""
    offset = start
    for raw in text[start:].splitlines(keepends=True)[1:]:
        offset_here, offset = offset, offset + len(raw)
        if before is not None and offset_here >= before:
            return None
        line = raw.rstrip("\n")
        prefix = RANK_PREFIX.match(line)
        body = line[prefix.end():] if prefix else line
        if not body.strip() or body[0].isspace():
            continue  # a frame, its source line, the carets
        m = EXCEPTION_NAME.match(body)
        if not m:
            return None
        rank = f"rank {prefix.group(1)}: " if prefix else ""
        return f"{rank}{m.group(1).rsplit('.', 1)[-1]}{': ' + m.group(2) if m.group(2) else ''}"
    return None


def record(exc: BaseException) -> None:
    """This rank's failure, into ``$MCORE_DAPO_FAILURES`` (nothing when the variable is unset)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    rec: dict = {"rank": rank, "time": time.time()}
    line = user_error_line(exc)
    if line is not None:
        rec["user_error"] = line
    else:
        message = str(exc).strip()
        rec.update({"type": type(exc).__name__, "message": message.splitlines()[0] if message else "",
                    "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))})
    try:
        Path(folder, f"rank{rank}.json").write_text(json.dumps(rec))
    except OSError:
        pass  # the launcher's folder is gone: the log still has the traceback


def read_records(folder: Path) -> list[dict]:
    """The failure records in ``folder``, earliest first."""
    out = []
    for p in sorted(Path(folder).glob("rank*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.get("time", 0.0))


@dataclass
class Failure:
    """A failed run in one line: ``user_error`` (a user mistake: the line alone) or ``line`` (what failed)."""

    user_error: str | None
    line: str


def summarize(records: list[dict], log_text: str = "") -> Failure:
    """The first failing rank's error: a user mistake in a record or anywhere in the log, else the earliest
    record's exception, else the log's first traceback, else its last line."""
    for r in records:
        if r.get("user_error"):
            return Failure(r["user_error"], r["user_error"])
    found = user_error_in_text(log_text)
    if found:
        return Failure(found, found)
    if records:
        r = records[0]
        return Failure(None, f"rank {r['rank']}: {r['type']}: {r['message']}")
    exc = exception_in_text(log_text)
    if exc:
        return Failure(None, exc)
    tail = [ln.strip() for ln in ANSI.sub("", log_text).splitlines() if ln.strip()]
    return Failure(None, tail[-1] if tail else "no output")


CLI_ERROR_LINE = re.compile(r"^error: (.+?)\s*$", re.MULTILINE)  # how this project's entry points print a UserError
FAILED_LINE = re.compile(r"^failed: (.+?)\s*$", re.MULTILINE)  # ... and anything else (main_dapo)


def summarize_entry_point_log(log_text: str) -> Failure:
    """A failed run of one of this project's entry points (``main_dapo`` under ``tiny-dapo``), from its log:
    the one line it printed for a user mistake (raised in a Ray actor too), else a UserError in any
    traceback, else its own summary of what failed, else its own uncaught exception."""
    text = ANSI.sub("", log_text)
    m = CLI_ERROR_LINE.search(text)
    if m:
        return Failure(m.group(1), m.group(1))
    found = user_error_in_text(text)
    if found:
        return Failure(found, found)
    m = FAILED_LINE.search(text)
    if m:
        return Failure(None, m.group(1))
    exc = exception_in_text(text, last=True)
    if exc:
        return Failure(None, exc)
    return summarize([], text)


def keep_log(name: str, log_text: str, records: list[dict]) -> Path:
    """The run's output and every rank's traceback, kept in a file that outlives the run; its path."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"mcore-dapo-{name}-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(log_text)
        for r in records:
            if r.get("traceback"):
                f.write(f"\n--- rank {r['rank']} ---\n{r['traceback']}")
    return Path(path)
