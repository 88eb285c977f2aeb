"""Run a callback right after a given module has been imported (or now, if it already is).

The plugin is loaded at ``import verl``; what it registers lives in verl modules that must not be
imported that early (verl's engine package imports Megatron, and on Ascend MindSpeed has to come
first). A finder on ``sys.meta_path`` wraps the loader of the named module so that the callbacks
run once its code has executed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Callable

_pending: dict[str, list[Callable[[], None]]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _pending:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_call(module):
            exec_module(module)
            for callback in _pending.pop(name, []):
                callback()

        spec.loader.exec_module = exec_and_call
        return spec


def after_import(module: str, callback: Callable[[], None]) -> None:
    if module in sys.modules:
        callback()
        return
    _pending.setdefault(module, []).append(callback)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
