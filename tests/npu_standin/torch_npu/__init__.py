"""Test-only stand-in for torch_npu: lets MindSpeed import on a machine without an NPU.

Every name MindSpeed looks up here resolves to a placeholder that raises when used, so
importing and patching work while any NPU kernel call fails loudly.
"""
import sys
import types

__version__ = "2.7.1.standin"


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


class _SubmoduleFinder:
    """Any ``<package>.<name>`` submodule is a placeholder module of absent names."""

    def __init__(self, package):
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.package + "."):
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = _module(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def absent_names(package):
    """The module ``__getattr__`` of a stand-in package whose every name is absent; its submodules too."""
    sys.meta_path.append(_SubmoduleFinder(package))

    def __getattr__(item):
        if item.startswith("__"):
            raise AttributeError(item)
        return NpuAbsent(f"{package}.{item}")

    return __getattr__


__getattr__ = absent_names(__name__)

# torch_npu makes its device namespace torch.npu; here every name in it is absent.
import torch  # noqa: E402

npu = _module(__name__ + ".npu")
npu.__path__ = []
sys.modules[npu.__name__] = npu
npu.is_available = lambda: False  # no NPU on this machine: the truthful answers
npu.device_count = lambda: 0
torch.npu = npu


class _HcclOptions:
    """torch_npu's ProcessGroupHCCL.Options: HCCL settings of a process group (gloo ignores them)."""

    def __init__(self):
        self.hccl_config = {}


_C = _module(__name__ + "._C")
_C._distributed_c10d = _module(__name__ + "._C._distributed_c10d")
_C._distributed_c10d.ProcessGroupHCCL = types.SimpleNamespace(Options=_HcclOptions)

# dtypes the NPU does not support (MindSpeed's dist-train feature reads this list when a
# TransformerConfig is validated); the stand-in lists torch's quantized dtypes
unsupported_dtype = [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32, torch.qint8]

# torch_npu.utils.collect_env.get_cann_version: the CANN version, "not known" where CANN is not installed, as
# here (MindSpeed's MoE overlap modules read it at import: mindspeed/core/transformer/moe/moe_feature/overlap/
# token_dispatcher.py)
utils = _module(__name__ + ".utils")
utils.__path__ = []
sys.modules[utils.__name__] = utils
utils.collect_env = _module(utils.__name__ + ".collect_env")
utils.collect_env.get_cann_version = lambda: "not known"
sys.modules[utils.collect_env.__name__] = utils.collect_env
