"""Test-only stand-in for torchair (shipped with torch_npu): lets MindSpeed import on a machine without an NPU.

Every name MindSpeed looks up here resolves to a placeholder that raises when used, so
importing and patching work while any NPU kernel call fails loudly.
"""
import sys
import types

__version__ = "0.standin"


class NpuAbsent:
    """An NPU operator, dtype or class of torch_npu that this stand-in does not have."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} needs an Ascend NPU (torch_npu stand-in)")

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return NpuAbsent(f"{self._name}.{item}")

    def __repr__(self):
        return f"<absent {self._name}>"


def _module(name):
    mod = types.ModuleType(name)
    mod.__getattr__ = lambda item, _n=name: (_ for _ in ()).throw(AttributeError(item)) if item.startswith("__") else NpuAbsent(f"{_n}.{item}")
    return mod


def __getattr__(item):
    if item.startswith("__"):
        raise AttributeError(item)
    return NpuAbsent(f"torchair.{item}")


class _SubmoduleFinder:
    """Any ``torchair.<name>`` submodule is a placeholder module of absent names."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, cls, is_package=True)

    @staticmethod
    def create_module(spec):
        mod = _module(spec.name)
        mod.__path__ = []
        return mod

    @staticmethod
    def exec_module(module):
        pass


sys.meta_path.append(_SubmoduleFinder)


def register_fx_node_ge_converter(op):
    """Graph-mode (GE) converters never run on the CPU: registration keeps the function as it is."""
    return lambda fn: fn
