"""Test-only stand-in for torchair (shipped with torch_npu): lets MindSpeed import on a machine without an NPU.

Every name MindSpeed looks up here resolves to a placeholder that raises when used, so
importing and patching work while any NPU kernel call fails loudly.
"""
from torch_npu import absent_names  # the same placeholders (torchair ships with torch_npu)

__version__ = "0.standin"

__getattr__ = absent_names(__name__)


def register_fx_node_ge_converter(op):
    """Graph-mode (GE) converters never run on the CPU: registration keeps the function as it is."""
    return lambda fn: fn
