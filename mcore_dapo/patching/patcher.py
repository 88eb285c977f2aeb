"""What an implementation is handed: a :class:`Patcher` bound to its manifest entry.

It changes only the entry's declared targets, the way its ``kind`` says: a ``wrap`` receives the
original and must call it (the wrapper has to hold it in its closure), a ``replace`` never receives
it and must not hold it. Every change is recorded, and :meth:`Patcher.undo` reverts them all.
"""

from __future__ import annotations

import functools
import importlib
import sys
from fnmatch import fnmatchcase
from types import ModuleType
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from mcore_dapo.patching.registry import PatchSpec

Undo = Callable[[], None]

_MISSING = object()


def _resolve(target: str):
    """``"pkg.mod:Cls.attr"`` -> (``Cls``, ``"attr"``), importing ``pkg.mod``."""
    module, path = target.split(":")
    *owners, attr = path.split(".")
    owner = importlib.import_module(module)
    for name in owners:
        owner = getattr(owner, name)
    return owner, attr


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return _MISSING


def _closes_over(fn, obj) -> bool:
    """Whether function ``fn`` holds ``obj`` in its closure (how a wrapper reaches its original)."""
    return any(_cell_value(c) is obj for c in getattr(fn, "__closure__", None) or ())


def _swap(owner, attr: str, new) -> Undo:
    """Set ``owner.attr = new``. The undo puts the original back, for a module's function or module
    also where it has been imported by name since (``from owner import attr``)."""
    old = getattr(owner, attr, _MISSING)
    setattr(owner, attr, new)

    def undo():
        if old is _MISSING:
            delattr(owner, attr)
            return
        setattr(owner, attr, old)
        if isinstance(owner, ModuleType) and (callable(new) or isinstance(new, ModuleType)):
            for m in list(sys.modules.values()):
                if isinstance(m, ModuleType) and m.__dict__.get(attr) is new:
                    m.__dict__[attr] = old

    return undo


class Patcher:
    """Handed to an implementation: changes the targets its manifest entry declares, the way its
    ``kind`` says, and records every change for :meth:`undo`."""

    def __init__(self, spec: PatchSpec):
        self.spec = spec
        self._undos: list[Undo] = []

    def wrap(self, make: Callable, *targets: str) -> None:
        """Install ``make(original)`` at ``targets`` (the object's definition and the modules that import it
        by name). The wrapper must call the original: it has to hold it in its closure."""
        original = self._original("wrap", targets)
        if original is _MISSING:
            raise ValueError(f"patch {self.spec.id}: {targets[0]} does not exist, there is nothing to wrap")
        new = make(original)
        if not _closes_over(new, original):
            raise ValueError(f"patch {self.spec.id} is declared 'wrap' but its {targets[0]} does not call the "
                             "original (a wrapper holds it in its closure); declare it 'replace'")
        functools.update_wrapper(new, original)
        self._install(targets, new)

    def replace(self, new, *targets: str) -> None:
        """Install ``new`` at ``targets``; it is not handed the original and must not hold it."""
        original = self._original("replace", targets)
        if original is not _MISSING and _closes_over(new, original):
            raise ValueError(f"patch {self.spec.id} is declared 'replace' but its {targets[0]} holds the "
                             "original; declare it 'wrap'")
        self._install(targets, new)

    def on_undo(self, undo: Undo) -> None:
        """Something else to undo (an import hook), run in reverse order with the rest."""
        self._undos.append(undo)

    def undo(self) -> None:
        while self._undos:
            self._undos.pop()()

    def _original(self, kind: str, targets: tuple[str, ...]):
        if kind != self.spec.kind:
            raise ValueError(f"patch {self.spec.id} is declared {self.spec.kind!r} in the manifest, "
                             f"its implementation does {kind!r}")
        undeclared = [t for t in targets if "*" in t or not any(fnmatchcase(t, d) for d in self.spec.target)]
        if undeclared or not targets:
            raise ValueError(f"patch {self.spec.id}: {undeclared or 'no target'} is not among its manifest "
                             f"targets {list(self.spec.target)}")
        found = [getattr(*_resolve(t), _MISSING) for t in targets]
        if any(f is not found[0] for f in found):
            raise ValueError(f"patch {self.spec.id}: {', '.join(targets)} are not one object")
        return found[0]

    def _install(self, targets: tuple[str, ...], new) -> None:
        for t in targets:
            self._undos.append(_swap(*_resolve(t), new))
