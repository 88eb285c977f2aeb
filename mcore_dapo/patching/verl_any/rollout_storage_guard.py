"""``verl.any.rollout-storage-guard``: a weight sync into vLLM must keep the engine's parameter storage.

A captured graph (CUDA graphs, vllm-ascend's ACLGraph) replays the memory addresses it saw at capture; a
weight sync that rebinds a parameter (a new tensor in place of the old one) leaves the graph reading the
old weights, silently. verl 0.9.1 loads the trained weights in vLLM's worker through its colocate worker
extension (``vLLMColocateWorkerExtension.update_weights_from_ipc`` in verl/workers/rollout/vllm_rollout/utils.py:
``model.load_weights`` per bucket, then ``process_weights_after_loading``); the separate_async checkpoint
engines end in the same method's loading path on the receiving side. This patch records every parameter's
storage address before and after each sync: a parameter that moved while the engine runs graphs
(``compilation_config.cudagraph_mode`` other than NONE) stops the sync with one line naming it; in eager mode
a moved parameter costs nothing and is logged once.

``MCORE_DAPO_ROLLOUT_HOOK=module:function`` (how the checks look inside the engine; nothing reads it
otherwise): the function is called in the vLLM worker as ``function("bucket", extension, weights=...)`` for
every bucket received and ``function("synced", extension, before=..., after=...)`` after each sync, with the
address maps of :func:`storage_map`.
"""

from __future__ import annotations

import logging
import os

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "verl.workers.rollout.vllm_rollout.utils"
EXTENSION = "vLLMColocateWorkerExtension"
HOOK_ENV = "MCORE_DAPO_ROLLOUT_HOOK"

log = logging.getLogger(__name__)
_warned: set[str] = set()


def storage_map(models) -> dict[str, int]:
    """Every parameter's storage address, by name (the models' names joined: verl syncs the main model and any
    drafter), read without touching the data."""
    return {f"{i}.{name}": p.untyped_storage().data_ptr()
            for i, model in enumerate(models) for name, p in model.named_parameters()}


def moved(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """Names whose storage is not where it was (or that appeared or went)."""
    return sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))


def runs_graphs(vllm_config) -> bool:
    """Whether the engine replays captured graphs: vLLM's ``compilation_config.cudagraph_mode`` (vllm/config/
    compilation.py's CUDAGraphMode; vllm-ascend's ACLGraph reads the same field) is not NONE."""
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if mode is None:
        return not getattr(getattr(vllm_config, "model_config", None), "enforce_eager", True)
    return getattr(mode, "name", str(mode)) != "NONE"


def check_moved(names: list[str], graphs: bool) -> None:
    """One line for a sync that rebound parameters: an error under graphs, a log line once in eager mode."""
    if not names:
        return
    if graphs:
        from mcore_dapo.errors import UserError

        raise UserError(
            f"the weight sync rebound {len(names)} vLLM parameter(s) (first: {names[0]}) while the engine replays "
            "captured graphs, which would keep reading the old weights: run the rollout eagerly "
            "(actor_rollout_ref.rollout.enforce_eager=True, ENFORCE_EAGER=True in the launch scripts) with this engine")
    key = names[0]
    if key not in _warned:
        _warned.add(key)
        log.info("weight sync rebound %d vLLM parameter(s) (first: %s); harmless in eager mode", len(names), key)


def _hook():
    spec = os.environ.get(HOOK_ENV, "")
    if not spec:
        return None
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        from mcore_dapo.errors import UserError

        raise UserError(f"{HOOK_ENV}={spec!r} is not accepted: accepted is module:function of an importable module")


def _guarding(original):
    def update_weights_from_ipc(self, *args, **kwargs):
        models = list(self._iter_all_models())
        before = storage_map(models)
        result = original(self, *args, **kwargs)
        after = storage_map(models)
        hook = _hook()
        if hook is not None:
            hook("synced", self, before=before, after=after)
        check_moved(moved(before, after), runs_graphs(self.model_runner.vllm_config))
        return result

    return update_weights_from_ipc


def _showing_buckets(original):
    def _update_weights(self, weights, *args, **kwargs):
        hook = _hook()
        if hook is not None:
            hook("bucket", self, weights=weights)
        return original(self, weights, *args, **kwargs)

    return _update_weights


@implements("verl.any.rollout-storage-guard")
def _rollout_storage_guard(patch: Patcher) -> None:
    def install():
        patch.wrap(_guarding, f"{MODULE}:{EXTENSION}.update_weights_from_ipc")
        patch.wrap(_showing_buckets, f"{MODULE}:{EXTENSION}._update_weights")

    patch.on_undo(after_import(MODULE, install))
