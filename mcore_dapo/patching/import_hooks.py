"""Run callbacks right after a module's code has executed, before its importer sees it.

Megatron imports most of its modules lazily, and verl's plugin is loaded at ``import verl``, before
the verl modules it registers into (or patches) may be imported. One finder on ``sys.meta_path``
serves both: for a watched module it finds the spec through the other finders and wraps the
loader's ``exec_module`` so that the callbacks run once the module's code has executed.
"""

from __future__ import annotations

import importlib.abc
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

Cancel = Callable[[], None]


@dataclass(eq=False)
class _Watch:
    matches: Callable[[str], bool]
    callback: Callable[[ModuleType], None]
    once: bool
    before: Callable[[], Callable[[], None]] | None = None  # run before the code; returns what runs after it


_watches: list[_Watch] = []


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if not any(w.matches(name) for w in _watches):
            return None
        spec = _spec_from_other_finders(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_call(module):
            afters = [w.before() for w in _watches if w.matches(name) and w.before is not None]
            try:
                exec_module(module)
            finally:
                for after in reversed(afters):
                    after()
            for w in [w for w in _watches if w.matches(name)]:
                if w.once:
                    _unwatch(w)
                w.callback(module)

        spec.loader.exec_module = exec_and_call
        return spec


def _spec_from_other_finders(hook, name, path, target):
    for finder in list(sys.meta_path):
        if finder is not hook and hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
    return None


_FINDER = _AfterImport()


def _watch(w: _Watch) -> Cancel:
    _watches.append(w)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return lambda: _unwatch(w)


def _unwatch(w: _Watch) -> None:
    if w in _watches:
        _watches.remove(w)
    if not _watches and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def after_import(name: str, callback: Callable[[], None]) -> Cancel:
    """Run ``callback()`` once module ``name`` has executed (now, if it is imported already).
    Returns a cancel for a callback still waiting."""
    if name in sys.modules:
        callback()
        return lambda: None
    return _watch(_Watch(lambda n: n == name, lambda module: callback(), once=True))


def after_each_import(prefix: str, callback: Callable[[ModuleType], None]) -> Cancel:
    """Run ``callback(module)`` for every module whose name starts with ``prefix`` imported from now
    on, until cancelled."""
    return _watch(_Watch(lambda n: n.startswith(prefix), callback, once=False))


def around_import(name: str, before: Callable[[], Callable[[], None]]) -> Cancel:
    """Run ``before()`` right before module ``name``'s code executes and the function it returns right
    after (also when the code raises): for a module that acts on something while it executes, e.g. a
    version check at import time. Once; nothing happens if ``name`` is imported already."""
    if name in sys.modules:
        return lambda: None
    return _watch(_Watch(lambda n: n == name, lambda module: None, once=True, before=before))
