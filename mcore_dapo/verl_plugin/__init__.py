"""verl plugin: ``actor_rollout_ref.actor.strategy=megatron`` on this project's Megatron path.

Importing this package registers nothing and does not import verl; nor do its modules, but for those that hold
a subclass of a verl class (:mod:`.engine`: the engines, :mod:`.checkpoint_manager`, and in
:mod:`mcore_dapo.verl_cpu` the platform and the rollout's replica and adapter), which import verl; the engines and
the platform register themselves at their class statement, as verl's own do (:mod:`.registrations`). verl
imports :mod:`.enable` (entry point group ``verl.plugins``) at ``import verl``; that import does light work only,
and never imports Megatron (MindSpeed must come first on Ascend):

* checks verl's version against :data:`mcore_dapo.versions.SUPPORTED_VERL` (a warning here; the
  checks of :mod:`mcore_dapo.verl_plugin.config_checks` refuse with a one-line error; the
  manifest's verl patches carry the same range);
* when the process is ``python -m verl.trainer.main_ppo``, rewrites its Hydra
  overrides so that ``actor_rollout_ref.actor.strategy=megatron`` selects verl's
  Megatron config group (``model_engine=megatron``), see :mod:`.overrides`;
* installs :mod:`.registrations`' table: once verl imports a registry's module, the platform's and the engines'
  modules are imported (their classes register themselves) and the rollout's classes registered by path, the
  device prepared before verl's engine package (which imports Megatron);
* applies the patch registry's verl patches for the host's device and for the ``cpu`` platform.

The documented entry point is ``python -m mcore_dapo.verl_plugin.main_dapo <overrides>``.
"""

from __future__ import annotations

from mcore_dapo.versions import SUPPORTED_VERL, version_in


def verl_version_ok(version: str) -> bool:
    return version_in(version, SUPPORTED_VERL)
