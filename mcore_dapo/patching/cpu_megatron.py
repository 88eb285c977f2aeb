"""Patches that let real megatron-core run on the CPU under gloo (see patches/manifest.toml).

Kept narrow on purpose: Megatron's own modules see a *view* of torch whose ``cuda``
namespace maps to the CPU; every other package (transformers computing the HF
reference, in particular) keeps the real thing. The one exception touches a tensor
method, for the duration of two dist-checkpoint exchange functions only
(``cpu.megatron.dist-ckpt-exchange``).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
import types

import torch

from mcore_dapo.patching.registry import Undo, chain, implements, swap

# --------------------------------------------------------------------------------------
# cpu.megatron.torch-cuda-namespace
# --------------------------------------------------------------------------------------


def _cpu_device(dev):
    """Map a CUDA device spec (str, torch.device, int index) to the CPU; leave others alone."""
    if dev is None:
        return None
    if isinstance(dev, int):
        return torch.device("cpu")
    if isinstance(dev, str) and dev.startswith("cuda"):
        return torch.device("cpu")
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("cpu")
    return dev


class _Stream:
    """Stand-in for torch.cuda.Stream / Event on the CPU: work is already ordered."""

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return self

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0


_STREAM = _Stream()


class _CpuRandom:
    get_rng_state = staticmethod(lambda device="cuda": torch.get_rng_state())
    set_rng_state = staticmethod(lambda new_state, device="cuda": torch.set_rng_state(new_state))
    manual_seed = staticmethod(lambda seed: torch.manual_seed(seed))
    manual_seed_all = staticmethod(lambda seed: torch.manual_seed(seed))


class _CpuCuda:
    """``torch.cuda`` as Megatron's modules see it on the CPU."""

    random = _CpuRandom
    get_rng_state = staticmethod(_CpuRandom.get_rng_state)
    set_rng_state = staticmethod(_CpuRandom.set_rng_state)
    manual_seed = staticmethod(_CpuRandom.manual_seed)
    manual_seed_all = staticmethod(_CpuRandom.manual_seed_all)
    Stream = _Stream
    Event = _Stream

    @staticmethod
    def current_device():
        return torch.device("cpu")

    @staticmethod
    def current_stream(device=None):
        return _STREAM

    default_stream = current_stream

    @staticmethod
    def stream(s=None):
        return contextlib.nullcontext()

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def set_device(device):
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def memory_allocated(device=None):
        return 0

    max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated

    class nvtx:  # noqa: N801
        range_push = staticmethod(lambda *a, **k: None)
        range_pop = staticmethod(lambda *a, **k: None)
        range = staticmethod(lambda *a, **k: contextlib.nullcontext())

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


_FACTORIES = (
    "empty", "zeros", "ones", "full", "arange", "tensor", "as_tensor", "randn", "rand", "randint",
    "randperm", "eye", "linspace", "empty_like", "zeros_like", "ones_like", "full_like", "empty_strided",
)


def _cpu_factory(fn):
    def factory(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    factory.__name__ = fn.__name__
    factory.__wrapped__ = fn
    return factory


class _TorchView(types.ModuleType):
    """``torch`` for Megatron's modules: real torch except ``cuda`` and device="cuda" factories."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


_VIEW = _TorchView()


def _retarget(module) -> bool:
    if module.__dict__.get("torch") is torch:
        module.__dict__["torch"] = _VIEW
        return True
    return False


class _MegatronImportHook(importlib.abc.MetaPathFinder):
    """Give Megatron modules imported later (Megatron imports lazily) the same view."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("megatron."):
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            _retarget(module)

        loader.exec_module = exec_module
        return spec


@implements("cpu.megatron.torch-cuda-namespace")
def _torch_cuda_namespace() -> Undo:
    touched = [m for name, m in list(sys.modules.items()) if name.startswith("megatron.") and m and _retarget(m)]
    hook = _MegatronImportHook()
    sys.meta_path.insert(0, hook)

    def undo():
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        for name, m in list(sys.modules.items()):
            if name.startswith("megatron.") and m and m.__dict__.get("torch") is _VIEW:
                m.__dict__["torch"] = torch
        del touched[:]

    return undo


# --------------------------------------------------------------------------------------
# cpu.megatron.rng-state
# --------------------------------------------------------------------------------------


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


@implements("cpu.megatron.rng-state")
def _rng_state() -> Undo:
    from megatron.core.tensor_parallel import random as mrandom

    undo_get = swap(mrandom, "_get_cuda_rng_state", _get_rng_state)
    undo_set = swap(mrandom, "_set_cuda_rng_state", _set_rng_state)

    def undo():
        undo_set()
        undo_get()

    return undo


# --------------------------------------------------------------------------------------
# cpu.megatron.moe-router-gemm
# --------------------------------------------------------------------------------------


@implements("cpu.megatron.moe-router-gemm")
def _router_gemm() -> Undo:
    from megatron.core.transformer.moe import moe_utils

    if "te_general_gemm" in moe_utils.__dict__:
        return lambda: None
    return swap(moe_utils, "te_general_gemm", None)


# --------------------------------------------------------------------------------------
# cpu.megatron.alltoall-split-lists
# --------------------------------------------------------------------------------------


def _as_list(splits):
    if splits is None or isinstance(splits, list):
        return splits
    if isinstance(splits, torch.Tensor):
        return [int(x) for x in splits.tolist()]
    return [int(x) for x in splits]


@implements("cpu.megatron.alltoall-split-lists")
def _alltoall_lists() -> Undo:
    from megatron.core.transformer.moe import token_dispatcher

    original = token_dispatcher.all_to_all

    def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None):
        return original(group, input_, _as_list(output_split_sizes_), _as_list(input_split_sizes))

    all_to_all.__wrapped__ = original
    return swap(token_dispatcher, "all_to_all", all_to_all)


# --------------------------------------------------------------------------------------
# cpu.megatron.uneven-gather-scatter
# --------------------------------------------------------------------------------------


def _uneven_all_gather(input_, group, sizes):
    import torch.distributed as dist

    width = max(sizes)
    padded = input_.new_zeros((width,) + tuple(input_.shape[1:]))
    padded[: input_.shape[0]] = input_
    out = input_.new_empty((width * len(sizes),) + tuple(input_.shape[1:]))
    dist.all_gather_into_tensor(out, padded.contiguous(), group=group)
    return torch.cat([out[i * width: i * width + n] for i, n in enumerate(sizes)], dim=0)


def _uneven_reduce_scatter(input_, group, sizes):
    import torch.distributed as dist

    total = input_.contiguous().clone()
    dist.all_reduce(total, group=group)
    start = sum(sizes[: group.rank()])
    return total[start: start + sizes[group.rank()]].contiguous()


@implements("cpu.megatron.uneven-gather-scatter")
def _uneven_gather_scatter() -> Undo:
    from megatron.core.tensor_parallel import mappings

    gather, scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def _gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        return _uneven_all_gather(input_, group, _as_list(output_split_sizes))

    def _reduce_scatter_along_first_dim(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return scatter(input_, group, input_split_sizes, use_global_buffer)
        return _uneven_reduce_scatter(input_, group, _as_list(input_split_sizes))

    _gather_along_first_dim.__wrapped__ = gather
    _reduce_scatter_along_first_dim.__wrapped__ = scatter
    return chain(swap(mappings, "_gather_along_first_dim", _gather_along_first_dim),
                 swap(mappings, "_reduce_scatter_along_first_dim", _reduce_scatter_along_first_dim))


# --------------------------------------------------------------------------------------
# cpu.megatron.float16-optimizer-param-types
# --------------------------------------------------------------------------------------


def _cuda_type_name(param) -> str:
    name = torch.Tensor.type(param)
    return name.replace("torch.", "torch.cuda.", 1) if param.device.type == "cpu" else name


@implements("cpu.megatron.float16-optimizer-param-types")
def _float16_optimizer_param_types() -> Undo:
    from megatron.core.optimizer import optimizer as mopt

    cls = mopt.Float16OptimizerWithFloat16Params
    original = cls.__init__

    def __init__(self, optimizer, *args, **kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for p in params:  # seen as torch.cuda.* by the type check in __init__ only
            p.type = _cuda_type_name.__get__(p)
        try:
            original(self, optimizer, *args, **kwargs)
        finally:
            for p in params:
                del p.type

    __init__.__wrapped__ = original
    return swap(cls, "__init__", __init__)


# --------------------------------------------------------------------------------------
# cpu.megatron.clip-grads-cpu
# --------------------------------------------------------------------------------------


@implements("cpu.megatron.clip-grads-cpu")
def _clip_grads_cpu() -> Undo:
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mopt

    original = clip_grads.clip_grad_by_total_norm_fp32

    def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
        """Megatron's function without its ``torch.cuda.FloatTensor`` assertion (fp32 is still required)."""
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        grads = []
        for p in parameters:
            g = getattr(p, attr, None)
            if g is None:
                continue
            if not use_decoupled_grad and g.dtype != torch.float32:
                raise TypeError(f"clip_grad_by_total_norm_fp32 needs fp32 gradients, got {g.dtype}")
            grads.append(clip_grads.to_local_if_dtensor(g).detach())
        clip_coeff = max_norm / (total_norm + 1.0e-6)
        if clip_coeff < 1.0 and grads:
            torch._foreach_mul_(grads, clip_coeff)

    clip_grad_by_total_norm_fp32.__wrapped__ = original
    return chain(swap(clip_grads, "clip_grad_by_total_norm_fp32", clip_grad_by_total_norm_fp32),
                 swap(mopt, "clip_grad_by_total_norm_fp32", clip_grad_by_total_norm_fp32))


# --------------------------------------------------------------------------------------
# cpu.megatron.dist-ckpt-exchange
# --------------------------------------------------------------------------------------

_EXCHANGE_FUNCTIONS = ("exchange_loaded_tensors_gather_rounds", "exchange_loaded_tensors_broadcast")


@contextlib.contextmanager
def _tensor_cuda_stays_on_cpu():
    original = torch.Tensor.cuda

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        return self

    torch.Tensor.cuda = cuda
    try:
        yield
    finally:
        torch.Tensor.cuda = original


@implements("cpu.megatron.dist-ckpt-exchange")
def _dist_ckpt_exchange() -> Undo:
    from megatron.core.dist_checkpointing import exchange_utils
    from megatron.core.dist_checkpointing import tensor_aware_state_dict
    from megatron.core.dist_checkpointing.strategies import fully_parallel

    undos = []
    for name in _EXCHANGE_FUNCTIONS:
        original = getattr(exchange_utils, name)

        def wrapped(*args, _original=original, **kwargs):
            with _tensor_cuda_stays_on_cpu():
                return _original(*args, **kwargs)

        wrapped.__wrapped__ = original
        for module in (exchange_utils, fully_parallel, tensor_aware_state_dict):
            if getattr(module, name, None) is original:
                undos.append(swap(module, name, wrapped))
    return chain(*undos)
