"""The ``verl.plugins`` entry point: verl imports this module at ``import verl``, and the import registers the
plugin (what :mod:`mcore_dapo.verl_plugin` lists). No other module of the plugin registers anything on import."""

from __future__ import annotations

import logging
import sys

from mcore_dapo.verl_plugin import verl_version_ok
from mcore_dapo.versions import SUPPORTED_VERL

log = logging.getLogger(__name__)


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
