"""Module views: what a patch puts in place of a module global (``torch``, ``np``) inside the modules it
patches, so that the change is seen there alone. A view is the module itself but for the names given."""

from __future__ import annotations

import types
from typing import Callable


class ModuleView(types.ModuleType):
    """``base`` with ``overrides`` (name -> object) in front; every other name is ``base``'s own."""

    def __init__(self, base: types.ModuleType, **overrides):
        super().__init__(base.__name__)
        self.__dict__["_view_base"] = base
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self.__dict__["_view_base"], name)


def kwargs_rewritten(fn: Callable, rewrite: Callable[[dict], None]) -> Callable:
    """``fn`` whose keyword arguments ``rewrite`` may change in place before each call."""

    def call(*args, **kwargs):
        rewrite(kwargs)
        return fn(*args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "call")
    call.__wrapped__ = fn
    return call


def factories(base: types.ModuleType, names, rewrite: Callable[[dict], None]) -> dict:
    """``base``'s functions ``names``, each with its keyword arguments rewritten by ``rewrite``."""
    return {name: kwargs_rewritten(getattr(base, name), rewrite) for name in names}
