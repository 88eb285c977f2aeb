"""verl plugin: ``actor_rollout_ref.actor.strategy=megatron`` on this project's Megatron path.

Importing this package, or any module of it, registers nothing and does not import verl. verl imports
:mod:`.enable` (entry point group ``verl.plugins``) at ``import verl``; that import does light work only, and
never imports Megatron (MindSpeed must come first on Ascend):

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

from mcore_dapo.versions import SUPPORTED_VERL, version_in


def verl_version_ok(version: str) -> bool:
    return version_in(version, SUPPORTED_VERL)
