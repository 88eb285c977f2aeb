"""Every class of this project that verl finds in one of its registries, in one table.

Each row names verl's registry, the key it is registered under, the class (by its qualified name, as verl's own
rollout table spells classes) and the verl module whose import makes the registration possible. Classes are
registered as verl registers its own:

* the platform and the engines by a decorator at their class statement (``@registered``, verl's own
  ``@PlatformRegistry.register`` and ``@EngineRegistry.register``), which reads the class's rows here: importing
  the class's module registers it. The entry point (:func:`install`) imports the class's module right after verl
  imports the row's module, so ``import verl`` imports neither Megatron nor the engines;
* the rollout's replica and adapter by their path (verl registers its own rollouts so:
  verl/workers/rollout/replica.py's loaders, verl/workers/rollout/base.py's ``_ROLLOUT_REGISTRY``): their module
  is imported only when verl asks for the class.

One more module-level class, not registered with verl because verl constructs it by name inside its engine
(``MegatronEngine.initialize`` builds ``MegatronCheckpointManager``, verl/workers/engine/megatron/
transformer_impl.py): the plugin's engine rebuilds verl's manager as
:class:`mcore_dapo.verl_plugin.checkpoint_manager.McoreDapoCheckpointManager`. And one whose module registers
itself, by verl's contract: the ``gloo`` weight transport (:mod:`mcore_dapo.verl_cpu.checkpoint_engine`), whose
module verl imports when ``checkpoint_engine.custom_backend_module`` names it (verl/checkpoint_engine/base.py).

``MCORE_DAPO_VERL_ENGINE=0`` leaves verl's own engines in charge on CUDA and Ascend (the ``cpu`` row stays: verl has
no Megatron engine that runs there). ``MCORE_DAPO_ENGINE_HOOK=module:function``: every engine class is first passed
through that function, which returns the class to register: how verification attaches (the audit,
``mcore_dapo_checks.audit:audited``); the product imports none of it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

HOOK_ENV = "MCORE_DAPO_ENGINE_HOOK"  # "module:function" wrapping each engine class before it is registered
AUDIT_ENV = "MCORE_DAPO_AUDIT_DIR"  # where an audit writes (read by the audit)
SYNC_TRACE_ENV = "MCORE_DAPO_SYNC_TRACE"  # a file: the gloo checkpoint engine's line per side of each sync
ENGINE_ENV = "MCORE_DAPO_VERL_ENGINE"  # "0": verl's own engines on CUDA and Ascend
ENGINE_PACKAGE = "verl.workers.engine"
ROLLOUT_PACKAGE = "verl.workers.rollout"
PLATFORM_MANAGER = "verl.plugin.platform.platform_manager"

ENGINE = "mcore_dapo.verl_plugin.engine.McoreDapoEngine"
CPU_ENGINE = "mcore_dapo.verl_plugin.engine.McoreDapoCpuEngine"
REPLICA = "mcore_dapo.verl_cpu.replica"


@dataclass(frozen=True)
class Row:
    registry: str  # "platform", "engine" (by @registered); "rollout replica", "rollout adapter" (by path)
    key: tuple  # the registry's key: platform name; (model_type, backend, device, vendor); rollout name (, mode)
    cls: str  # the module-level class, "module.Class"
    after: str  # verl module whose import registers the row
    opt_out: str = ""  # an environment variable whose value "0" leaves the row out

    @property
    def module(self) -> str:
        return self.cls.rpartition(".")[0]

    def wanted(self) -> bool:
        return not self.opt_out or os.environ.get(self.opt_out, "1") != "0"


TABLE: tuple[Row, ...] = (
    # probed after verl's own platforms: chosen only when no accelerator answers (verl_cpu/platform.py)
    Row("platform", ("cpu",), "mcore_dapo.verl_cpu.platform.PlatformCPU", PLATFORM_MANAGER),
    # verl's registry looks (device, vendor) up before its own device-only keys; "cpu" has no vendor
    Row("engine", ("language_model", "megatron", "cpu", None), CPU_ENGINE, ENGINE_PACKAGE),
    Row("engine", ("language_model", "megatron", "cuda", "nvidia"), ENGINE, ENGINE_PACKAGE, ENGINE_ENV),
    Row("engine", ("language_model", "megatron", "npu", "huawei"), ENGINE, ENGINE_PACKAGE, ENGINE_ENV),
    Row("rollout replica", ("hf_cpu",), f"{REPLICA}.CpuRolloutReplica", ROLLOUT_PACKAGE),
    Row("rollout adapter", ("hf_cpu", "async"), f"{REPLICA}.CpuServerAdapter", ROLLOUT_PACKAGE),
)
DECORATED = ("platform", "engine")  # the registries whose rows @registered registers


def registered(cls):
    """Class decorator: register ``cls`` under its rows of :data:`TABLE` (an engine passed through the engine hook
    once, :func:`hooked`); a class with no row is a mistake of this project, raised at once."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    rows = [row for row in TABLE if row.cls == name]
    if not rows or any(row.registry not in DECORATED for row in rows):
        raise ValueError(f"{name} has no row of {DECORATED} in mcore_dapo.verl_plugin.registrations.TABLE")
    target = None
    for row in rows:
        if row.wanted():
            target = target or (hooked(cls) if row.registry == "engine" else cls)
            _register(row, target)
    return cls


def load(target: str):
    """The class ``module.Class`` (or the function ``module:function``) names."""
    module, _, name = target.rpartition(":") if ":" in target else target.rpartition(".")
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


def _register(row: Row, cls) -> None:
    """One row with verl's registry (a key registered before keeps its class: verl's engine registry asserts a key is
    new, its platform registry is asked first)."""
    if row.registry == "platform":
        from verl.plugin.platform.platform_manager import PlatformRegistry

        if PlatformRegistry.get(row.key[0]) is None:
            PlatformRegistry.register(platform=row.key[0])(cls)
    elif row.registry == "engine":
        from verl.workers.engine.base import EngineRegistry

        model_type, backend, device, vendor = row.key
        key = dict(model_type=model_type, backend=backend, device=device, **({"vendor": vendor} if vendor else {}))
        try:
            EngineRegistry.register(**key)(cls)
        except AssertionError:
            pass


def _register_by_path(row: Row) -> None:
    """A rollout row, as verl registers its own rollouts: its module imported when verl asks for the class."""
    if not row.wanted():
        return
    if row.registry == "rollout replica":
        from verl.workers.rollout.replica import RolloutReplicaRegistry

        RolloutReplicaRegistry.register(row.key[0], lambda: load(row.cls))
    elif row.registry == "rollout adapter":
        from verl.workers.rollout import base

        # verl 0.9.1 has no function that registers a rollout adapter: its registry is this dict of paths
        # (verl/workers/rollout/base.py, get_rollout_class), imported when verl asks
        base._ROLLOUT_REGISTRY[tuple(row.key)] = row.cls
    else:
        raise ValueError(f"registry {row.registry!r} is not one of the table's")


def _prepare_device():
    """Before verl's engine package executes (it imports Megatron): the device's preparation (MindSpeed's
    adaptor on Ascend, which must be imported before Megatron)."""
    from mcore_dapo.devices import get_adapter

    get_adapter().prepare()
    return lambda: None


def install() -> None:
    """Register every row once verl imports its module (what the entry point does): a decorated class's module
    imported (its class statement registers it; a module already executing, which imported verl itself, registers
    when it reaches the statement), a rollout row by its path."""
    from mcore_dapo.patching.import_hooks import after_import, around_import

    around_import(ENGINE_PACKAGE, _prepare_device)
    for row in TABLE:
        if row.registry in DECORATED:
            after_import(row.after, lambda row=row: importlib.import_module(row.module))
        else:
            after_import(row.after, lambda row=row: _register_by_path(row))
