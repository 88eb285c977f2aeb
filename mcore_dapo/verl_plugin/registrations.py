"""Every class of this project that verl finds in one of its registries, in one table.

Each row names verl's registry, the key it is registered under, the class (``module:Class``, a module-level class
of that module) and the verl module whose import makes the registration possible. The entry point
(:mod:`.enable`) installs the table (:func:`install`): a row is registered right after verl imports that module
(at once if it is imported already), so ``import verl`` imports neither Megatron nor the classes' modules, and a
class's module is imported only when its row is registered (the rollout's rows: only when verl asks for the
class, through the loader or module path verl's registries take). Importing this module does nothing.

One more module-level class, not registered with verl because verl constructs it by name inside its engine
(``MegatronEngine.initialize`` builds ``MegatronCheckpointManager``, verl/workers/engine/megatron/
transformer_impl.py): :data:`CHECKPOINT_MANAGER`, which the plugin's engine rebuilds verl's manager as. And one
whose module registers itself, by verl's contract: the ``gloo`` weight transport
(:mod:`mcore_dapo.verl_cpu.checkpoint_engine`), whose module verl imports when
``checkpoint_engine.custom_backend_module`` names it (verl/checkpoint_engine/base.py).

``MCORE_DAPO_VERL_ENGINE=0`` leaves verl's own engines in charge on CUDA and Ascend (the ``cpu`` row stays: verl has
no Megatron engine that runs there). ``MCORE_DAPO_ENGINE_HOOK=module:function``: every engine class is first passed
through that function, which returns the class to register: how verification attaches (the audit,
``mcore_dapo_checks.audit:audited``); the product imports none of it.

A class module imported before verl (``from mcore_dapo.verl_plugin.engine import ...`` first) is itself what
imports verl and its registry modules, so a class, or a subclass's base, does not exist yet when a row comes due:
the rows wait, and the last line of every class module of the table (:func:`complete`) registers them once none
is executing.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

HOOK_ENV = "MCORE_DAPO_ENGINE_HOOK"  # "module:function" wrapping each engine class before it is registered
AUDIT_ENV = "MCORE_DAPO_AUDIT_DIR"  # where an audit writes (read by the audit)
SYNC_TRACE_ENV = "MCORE_DAPO_SYNC_TRACE"  # a file: the gloo checkpoint engine's line per side of each sync
ENGINE_ENV = "MCORE_DAPO_VERL_ENGINE"  # "0": verl's own engines on CUDA and Ascend
ENGINE_PACKAGE = "verl.workers.engine"
ROLLOUT_PACKAGE = "verl.workers.rollout"
PLATFORM_MANAGER = "verl.plugin.platform.platform_manager"

ENGINE = "mcore_dapo.verl_plugin.engine:McoreDapoEngine"
CPU_ENGINE = "mcore_dapo.verl_cpu.engine:McoreDapoCpuEngine"
CHECKPOINT_MANAGER = "mcore_dapo.verl_plugin.checkpoint_manager:McoreDapoCheckpointManager"


@dataclass(frozen=True)
class Row:
    registry: str  # "platform", "engine", "rollout replica", "rollout adapter"
    key: tuple  # the registry's key: platform name; (model_type, backend, device, vendor); rollout name (, mode)
    target: str  # "module:Class"
    after: str  # verl module whose import registers the row
    opt_out: str = ""  # an environment variable whose value "0" leaves the row out

    def wanted(self) -> bool:
        return not self.opt_out or os.environ.get(self.opt_out, "1") != "0"


TABLE: tuple[Row, ...] = (
    # probed after verl's own platforms: chosen only when no accelerator answers (verl_cpu/platform.py)
    Row("platform", ("cpu",), "mcore_dapo.verl_cpu.platform:PlatformCPU", PLATFORM_MANAGER),
    # verl's registry looks (device, vendor) up before its own device-only keys; "cpu" has no vendor
    Row("engine", ("language_model", "megatron", "cpu", None), CPU_ENGINE, ENGINE_PACKAGE),
    Row("engine", ("language_model", "megatron", "cuda", "nvidia"), ENGINE, ENGINE_PACKAGE, ENGINE_ENV),
    Row("engine", ("language_model", "megatron", "npu", "huawei"), ENGINE, ENGINE_PACKAGE, ENGINE_ENV),
    Row("rollout replica", ("hf_cpu",), "mcore_dapo.verl_cpu.replica:CpuRolloutReplica", ROLLOUT_PACKAGE),
    Row("rollout adapter", ("hf_cpu", "async"), "mcore_dapo.verl_cpu.replica:CpuServerAdapter", ROLLOUT_PACKAGE),
)


def load(target: str):
    """The class ``module:Class`` names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def hooked(cls):
    """``cls`` through the function ``MCORE_DAPO_ENGINE_HOOK`` names (``module:function``), or ``cls`` itself."""
    spec = os.environ.get(HOOK_ENV, "")
    if not spec:
        return cls
    from mcore_dapo.errors import UserError

    module, _, name = spec.partition(":")
    try:
        hook = load(spec) if module and name else None
    except (ImportError, AttributeError):
        hook = None
    if not callable(hook):
        raise UserError(f"{HOOK_ENV}={spec!r} is not accepted: accepted is module:function of an importable module")
    return hook(cls)


_hooked: dict[str, type] = {}  # target -> the class registered (hooked once: CUDA and Ascend share one)


def engine_class(target: str) -> type:
    if target not in _hooked:
        _hooked[target] = hooked(load(target))
    return _hooked[target]


_pending: list[Row] = []  # rows whose class module was still executing when verl imported the registry's module


def _executing(module: str) -> bool:
    """Whether ``module``'s code is running now (imported, not finished)."""
    m = sys.modules.get(module)
    return m is not None and bool(getattr(getattr(m, "__spec__", None), "_initializing", False))


def _class_module_executing(but: str = "") -> bool:
    """Whether a class module of the table (other than ``but``) is executing: its own import of verl (its base
    class) is then what made verl import the registry's module, and its class, or a subclass's base, does not
    exist yet."""
    return any(_executing(m) for m in {r.target.partition(":")[0] for r in TABLE} - {but})


def register(row: Row, *, now: bool = False) -> None:
    """Register one row with verl (a key registered before keeps its class: verl's engine registry asserts a key
    is new, its platform registry is asked first). A row whose class module is still executing waits for
    :func:`complete`, which that module's last line calls."""
    if not row.wanted():
        return
    if not now and _class_module_executing():
        _pending.append(row)
        return
    if row.registry == "platform":
        from verl.plugin.platform.platform_manager import PlatformRegistry

        if PlatformRegistry.get(row.key[0]) is None:
            PlatformRegistry.register(platform=row.key[0])(load(row.target))
    elif row.registry == "engine":
        from verl.workers.engine.base import EngineRegistry

        model_type, backend, device, vendor = row.key
        key = dict(model_type=model_type, backend=backend, device=device, **({"vendor": vendor} if vendor else {}))
        try:
            EngineRegistry.register(**key)(engine_class(row.target))
        except AssertionError:
            pass
    elif row.registry == "rollout replica":
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        RolloutReplicaRegistry.register(row.key[0], lambda: load(row.target))  # imported when verl asks
    elif row.registry == "rollout adapter":
        from verl.workers.rollout import base

        # verl 0.9.1 has no function that registers a rollout adapter: its registry is this dict of module paths
        # (verl/workers/rollout/base.py, get_rollout_class), imported when verl asks
        base._ROLLOUT_REGISTRY[tuple(row.key)] = row.target.replace(":", ".")
    else:
        raise ValueError(f"registry {row.registry!r} is not one of the table's")


def complete(module: str) -> None:
    """Called by a class module at its last line: the rows :func:`register` left waiting, once no other class
    module is executing. Nothing happens where the entry point asked for none (verl imported without plugins)."""
    if _class_module_executing(but=module):
        return  # the last of them to finish registers them
    for row in list(_pending):
        if row in _pending:
            _pending.remove(row)
            register(row, now=True)  # the module's classes exist by its last line


def _prepare_device():
    """Before verl's engine package executes (it imports Megatron): the device's preparation (MindSpeed's
    adaptor on Ascend, which must be imported before Megatron)."""
    from mcore_dapo.devices import get_adapter

    get_adapter().prepare()
    return lambda: None


def install() -> None:
    """Register every row once verl imports its module (what the entry point does)."""
    from mcore_dapo.patching.import_hooks import after_import, around_import

    around_import(ENGINE_PACKAGE, _prepare_device)
    for row in TABLE:
        after_import(row.after, lambda row=row: register(row))
