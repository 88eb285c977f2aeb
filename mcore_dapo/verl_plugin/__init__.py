"""verl plugin: ``actor_rollout_ref.actor.strategy=megatron`` on this project's Megatron path.

verl imports this module (entry point group ``verl.plugins``) at ``import verl``.
It does light work only, and never imports Megatron (MindSpeed must come first on Ascend):

* checks verl's version against :data:`mcore_dapo.versions.SUPPORTED_VERL` (a warning here; the
  checks of :mod:`mcore_dapo.verl_plugin.config_checks` refuse with a one-line error; the
  manifest's verl patches carry the same range);
* when the process is ``python -m verl.trainer.main_ppo``, rewrites its Hydra
  overrides so that ``actor_rollout_ref.actor.strategy=megatron`` selects verl's
  Megatron config group (``model_engine=megatron``), see :mod:`.overrides`;
* registers a ``cpu`` platform with verl's ``PlatformRegistry`` (:mod:`mcore_dapo.verl_cpu.platform`),
  chosen by verl only when no accelerator answers and :func:`mcore_dapo.devices.detect` says ``cpu``, and
  applies the patch registry's verl patches for the host's device;
* registers this project's engine with verl's ``EngineRegistry`` once verl's
  engine package is imported (:mod:`.engine`; for verl's ``cpu`` device its subclass in
  :mod:`mcore_dapo.verl_cpu.engine`);
* registers the ``hf_cpu`` rollout (replica + worker adapter) once verl's rollout package is
  imported (:mod:`mcore_dapo.verl_cpu.rollout`).

The documented entry point is ``python -m mcore_dapo.verl_plugin.main_dapo <overrides>``.
"""

from __future__ import annotations

import logging
import sys

from mcore_dapo.versions import SUPPORTED_VERL, version_in

log = logging.getLogger(__name__)


def verl_version_ok(version: str) -> bool:
    return version_in(version, SUPPORTED_VERL)


def _on_import() -> None:
    try:
        import verl
    except ImportError:
        return
    if not verl_version_ok(getattr(verl, "__version__", "0")):
        if "mcore_dapo.verl_plugin.main_dapo" not in getattr(sys, "orig_argv", []):  # that one refuses in one line
            from mcore_dapo.verl_plugin.config_checks import unsupported_verl

            log.warning("%s: plugin not enabled", unsupported_verl(verl.__version__, SUPPORTED_VERL))
        return
    from mcore_dapo.verl_plugin.overrides import rewrite_main_argv

    rewrite_main_argv(sys.argv, getattr(sys, "orig_argv", []))
    from mcore_dapo.patching.import_hooks import after_import
    from mcore_dapo.verl_cpu import platform, rollout
    from mcore_dapo.verl_plugin.engine import register_when_imported

    platform.register()
    _apply_verl_patches()
    register_when_imported()
    after_import("verl.workers.rollout", rollout.register)


def _apply_verl_patches() -> None:
    """The registry's verl patches for the host's device (the ``cpu`` platform applies its own when it registers:
    :func:`mcore_dapo.verl_cpu.platform.register`)."""
    from mcore_dapo.devices import detect
    from mcore_dapo.patching import apply, load_implementations

    load_implementations()
    apply(detect(), package="verl")


_on_import()
