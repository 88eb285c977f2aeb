"""``verl.any.separate-async-logger``: verl 0.9.1's ``separate_async`` trainer cannot start with
``actor_rollout_ref.hybrid_engine=False``.

``PPOTrainerSeparateAsync._setup`` (verl/trainer/ppo/v1/trainer_separate_async.py) logs the standalone-only
rollout with ``logger.info(..., flush=True)``; ``logging.Logger`` takes no ``flush`` keyword, so the call raises
``TypeError: Logger._log() got an unexpected keyword argument 'flush'`` and the trainer stops before its first
step, on every device. The module's ``logger.info`` (that module's own logger only) drops ``flush`` and hands
everything else to logging's.
"""

from __future__ import annotations

from mcore_dapo.patching.import_hooks import after_import
from mcore_dapo.patching.patcher import Patcher
from mcore_dapo.patching.registry import implements

MODULE = "verl.trainer.ppo.v1.trainer_separate_async"


def _without_flush(original):
    def info(msg, *args, **kwargs):
        kwargs.pop("flush", None)  # print()'s keyword, which logging does not take
        return original(msg, *args, **kwargs)

    return info


@implements("verl.any.separate-async-logger")
def _separate_async_logger(patch: Patcher) -> None:
    patch.on_undo(after_import(MODULE, lambda: patch.wrap(_without_flush, f"{MODULE}:logger.info")))
