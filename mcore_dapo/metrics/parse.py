"""Read verl's console metric lines: ``step:N - key:value - key:value ...``.

The line may carry a prefix (Ray's ``(TaskRunner pid=123)``, colour codes, a timestamp);
everything before ``step:`` is ignored. A line that has the ``step:`` marker but does not
parse (a step that is not an integer, a segment that is not ``key:value``) is skipped and
counted. Values that are not numbers are dropped. Given a folder (a Ray session's
``logs/``), every file under it with such lines is read. Lines of the same step (the driver's log
and a worker's ``.out``, or validation metrics logged apart) are merged, a later value of a key
winning, and counted as repeated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mcore_dapo.errors import UserError

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MARKER = re.compile(r"(?:^|[\s)\]|>])step:\s*(\S+?)\s+-\s+(.*)$")
MAX_FILE_BYTES = 512 * 1024**2


@dataclass
class RunLog:
    """The metric lines of one run (one file, or one folder of files)."""

    source: str
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    malformed: int = 0
    duplicates: int = 0


NUMPY_SCALAR = re.compile(r"^np\.(?:float|int|uint)\d*\((.*)\)$")  # numpy 2's repr: np.float64(0.375)


def _number(text: str) -> float | None:
    wrapped = NUMPY_SCALAR.match(text.strip())
    if wrapped:
        text = wrapped.group(1)
    try:
        v = float(text)
    except ValueError:
        low = text.strip().lower()
        if low in ("true", "false"):
            return float(low == "true")
        return None
    return v


def parse_line(line: str) -> tuple[int, dict[str, float]] | None | str:
    """``(step, metrics)`` for a metric line, ``None`` for another line, ``"malformed"`` for a broken one."""
    if "step:" not in line:
        return None
    m = MARKER.search(ANSI.sub("", line.rstrip("\r\n")))
    if not m:
        return "malformed" if re.search(r"(?:^|\s)step:\s*\S+\s+-", line) else None
    step_text, rest = m.groups()
    if not step_text.isdigit():
        return "malformed"
    metrics: dict[str, float] = {}
    for seg in rest.split(" - "):
        key, sep, value = seg.strip().rpartition(":")
        if not sep or not key or not value or " " in key:
            return "malformed"
        num = _number(value)
        if num is not None:
            metrics[key] = num
    if not metrics:
        return "malformed"
    return int(step_text), metrics


def read_lines(lines, run: RunLog) -> int:
    """Add the metric lines of ``lines`` to ``run``; returns how many were read."""
    n = 0
    for line in lines:
        got = parse_line(line)
        if got is None:
            continue
        if got == "malformed":
            run.malformed += 1
            continue
        step, metrics = got
        if step in run.steps:
            run.duplicates += 1
        run.steps.setdefault(step, {}).update(metrics)  # verl may log a step's validation metrics apart
        n += 1
    return n


def _text_files(folder: Path) -> list[Path]:
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size <= MAX_FILE_BYTES:
            out.append(p)
    return out


def read_run(path: str | Path) -> RunLog:
    """The metric lines of a log file or of every file under a folder; one-line error when there are none."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"log {str(path)!r} does not exist: pass a verl console log file or a Ray session log folder")
    run = RunLog(str(path))
    files = _text_files(p) if p.is_dir() else [p]
    for f in files:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                if read_lines(fh, run):
                    run.files.append(str(f))
        except OSError as e:
            raise UserError(f"cannot read {str(f)!r}: {e.strerror}") from None
    if not run.steps:
        where = f"any of the {len(files)} files under {str(path)!r}" if p.is_dir() else repr(str(path))
        raise UserError(
            f"no verl metric lines ('step:N - key:value - ...') in {where} ({run.malformed} malformed lines "
            "skipped): accepted are verl console logs (trainer.logger includes 'console') and Ray session log folders"
        )
    return run
