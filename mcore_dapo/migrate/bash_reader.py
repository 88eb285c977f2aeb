"""The subset of bash that launch scripts use, read as bash would: variable assignments, ``export`` lines,
``${VAR}``, ``${VAR:-default}``, ``$((arithmetic))``, quotes, line continuations, and the ``python3 -m`` verl
command (:func:`read_launch`); or a file of ``key=value`` overrides."""

from __future__ import annotations

import ast
import operator
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mcore_dapo.errors import UserError
from mcore_dapo.launch_keys import ENTRY_MODULES


_ASSIGN = re.compile(r"^\s*(?:export\s+)?[A-Za-z_]\w*=")
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass
class Launch:
    source: str
    overrides: list[str]
    exports: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    entry: str | None = None


class _Shell:
    """Expands words the way bash does for the constructs launch scripts use; anything else (command
    substitution, an unset variable under ``set -u``) is one line naming it."""

    def __init__(self, source: str, env: dict[str, str]):
        self.source = source
        self.vars: dict[str, str] = {}
        self.env = env
        self.line = 0

    def _fail(self, what: str) -> UserError:
        return UserError(f"{self.source}:{self.line}: {what}")

    def lookup(self, name: str, default: str | None = None) -> str:
        if name in self.vars:
            return self.vars[name]
        if name in self.env:
            return self.env[name]
        if default is not None:
            return default
        raise self._fail(f"${{{name}}} is used but the script does not set it: set it in the script or the environment")

    def arith(self, expr: str) -> str:
        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: self.lookup(m.group(1)), expr)
        expr = _NAME.sub(lambda m: self.lookup(m.group(0), "0"), expr)
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}

        def ev(n):
            if isinstance(n, ast.Expression):
                return ev(n.body)
            if isinstance(n, ast.Constant) and isinstance(n.value, int):
                return n.value
            if isinstance(n, ast.BinOp) and type(n.op) in ops:
                return ops[type(n.op)](ev(n.left), ev(n.right))
            if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
                return -ev(n.operand)
            raise ValueError
        try:
            return str(ev(ast.parse(expr.strip(), mode="eval")))
        except (ValueError, SyntaxError, ZeroDivisionError):
            raise self._fail(f"$(({expr})) is not an integer expression this reader evaluates") from None

    def dollar(self, s: str, i: int) -> tuple[str, int]:
        """Expand the ``$`` construct at ``s[i]``; (text, index after it)."""
        if s.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(s):
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                if depth == 0:
                    break
                j += 1
            if j >= len(s) or s[j - 1] != ")":
                raise self._fail(f"unterminated {s[i:i + 20]}")
            return self.arith(s[i + 3:j - 1]), j + 1
        if s.startswith("$(", i) or s.startswith("$`", i):
            raise self._fail(f"command substitution {s[i:i + 30]}... is not evaluated: write the value itself")
        if s.startswith("${", i):
            j = s.find("}", i)
            if j < 0:
                raise self._fail(f"unterminated {s[i:i + 20]}")
            body = s[i + 2:j]
            m = re.fullmatch(r"([A-Za-z_]\w*)(?::?-(.*))?", body, re.S)
            if not m:
                raise self._fail(f"${{{body}}} is not a form this reader expands (${{VAR}}, ${{VAR:-default}})")
            default = self.expand_text(m.group(2)) if m.group(2) is not None else None
            return self.lookup(m.group(1), default), j + 1
        if s.startswith("$@", i) or s.startswith("$*", i):
            return "\0@", i + 2
        m = _NAME.match(s, i + 1)
        if m:
            return self.lookup(m.group(0)), m.end()
        return "$", i + 1

    def expand_text(self, s: str) -> str:
        return self.expand_until(s, 0, None)[0]

    def expand_until(self, s: str, i: int, stop: str | None) -> tuple[str, int]:
        """``s`` from ``i`` up to ``stop`` (or the end) as bash expands a double-quoted word: ``$`` forms and the
        backslash escapes of ``" \\ $ ` ``; (text, index of ``stop`` or ``len(s)``)."""
        out = []
        while i < len(s) and s[i] != stop:
            if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in '"\\$`':
                out.append(s[i + 1])
                i += 2
            elif s[i] == "$":
                t, i = self.dollar(s, i)
                out.append(t)
            else:
                out.append(s[i])
                i += 1
        return "".join(out), i

    def words(self, s: str) -> list[str]:
        words, cur, have, i = [], [], False, 0
        while i < len(s):
            c = s[i]
            if c in " \t\n":
                if have:
                    words.append("".join(cur))
                cur, have, i = [], False, i + 1
            elif c == "#" and not have:
                j = s.find("\n", i)
                i = len(s) if j < 0 else j
            elif c == ";" or c == "&" or c == "|":
                if have:
                    words.append("".join(cur))
                words.append(c)
                cur, have, i = [], False, i + 1
            elif c == "'":
                j = s.find("'", i + 1)
                if j < 0:
                    raise self._fail("unterminated single quote")
                cur.append(s[i + 1:j])
                have, i = True, j + 1
            elif c == '"':
                text, j = self.expand_until(s, i + 1, '"')
                if j >= len(s):
                    raise self._fail("unterminated double quote")
                cur.append(text)
                have, i = True, j + 1
            elif c == "\\":
                if i + 1 < len(s) and s[i + 1] != "\n":
                    cur.append(s[i + 1])
                    have = True
                i += 2
            elif c == "$":
                t, i = self.dollar(s, i)
                cur.append(t)
                have = True
            else:
                cur.append(c)
                have, i = True, i + 1
        if have:
            words.append("".join(cur))
        return words


def _logical_lines(text: str):
    """(first line number, line) with backslash-newline continuations joined."""
    buf, start = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            buf.append(line.rstrip()[:-1] + " ")
            continue
        buf.append(line)
        yield start, "".join(buf)
        buf, start = [], None
    if buf:
        yield start, "".join(buf)


def _entry(words: list[str]) -> int | None:
    """Index of the first override after ``python -m <entry module>`` in ``words``."""
    for i in range(len(words) - 2):
        if Path(words[i]).name.startswith("python") and words[i + 1] == "-m" and words[i + 2] in ENTRY_MODULES:
            return i + 2
    return None


def read_launch(path: str | Path, env: dict[str, str] | None = None) -> Launch:
    """The overrides (expanded), exports and variables of a launch script, or of a file of overrides."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"SCRIPT={str(path)!r} cannot be read ({e.strerror}): accepted is a bash launch script "
                        "or a file of key=value overrides") from None
    sh = _Shell(path.name, dict(os.environ) if env is None else env)
    launch: Launch | None = None
    exports: dict[str, str] = {}
    for n, line in _logical_lines(text):
        sh.line = n
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if any(f"-m {m}" in re.sub(r"\s+", " ", line) for m in ENTRY_MODULES):
            words = sh.words(line)
            i = _entry(words)
            if i is not None:
                args = []
                for w in words[i + 1:]:
                    if w in (";", "&", "|"):
                        break
                    if w != "\0@":
                        args.append(w.replace("\0@", ""))
                if launch is not None:
                    raise UserError(f"{path.name}:{n}: a second verl command: accepted is a script with one")
                launch = Launch(path.name, args, entry=words[i])
                continue
        if _ASSIGN.match(line) and not launch:
            words = sh.words(line)
            is_export = words and words[0] == "export"
            for w in words[1:] if is_export else words:
                if w in (";", "&", "|"):
                    break
                name, eq, value = w.partition("=")
                if not eq or not _NAME.fullmatch(name):
                    break
                sh.vars[name] = value
                if is_export:
                    exports[name] = value
    if launch is None:
        launch = _overrides_file(path.name, text, sh)
    launch.exports, launch.variables = exports, dict(sh.vars)
    return launch


def _overrides_file(name: str, text: str, sh: _Shell) -> Launch:
    words = [w for n, line in _logical_lines(text) for w in (setattr(sh, "line", n) or sh.words(line))]
    if words and all(re.match(r"^[+~]*[A-Za-z_][\w.]*[\w]=", w) and "." in w.partition("=")[0] for w in words):
        return Launch(name, words)
    raise UserError(f"{name} has no verl command: accepted is a bash launch running python3 -m "
                    f"{' / '.join(ENTRY_MODULES)}, or a file of key=value overrides")
