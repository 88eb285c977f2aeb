"""Hydra overrides: ``actor_rollout_ref.actor.strategy=megatron`` implies verl's Megatron config group.

verl 0.9.1 composes ``ppo_trainer.yaml`` whose defaults list starts with
``model_engine: dp`` and picks ``actor@actor_rollout_ref.actor: ${model_engine}_actor``
(likewise ref and critic). ``actor.strategy`` is only a field inside the chosen
file, so setting it alone keeps ``dp_actor.yaml`` (``FSDPActorConfig``) and every
``actor_rollout_ref.actor.megatron.*`` override fails to compose. A config value
cannot choose a defaults-list entry in Hydra, so the override list is rewritten
before composition: ``model_engine=megatron`` is added when the actor's strategy
is megatron and no ``model_engine`` is given.
"""

from __future__ import annotations

from mcore_dapo.errors import UserError
from mcore_dapo.launch_keys import STRATEGY_KEY, value_of

MAIN_MODULES = ("verl.trainer.main_ppo",)


def rewrite(overrides: list[str]) -> list[str]:
    """The overrides with ``model_engine=megatron`` added where the actor's strategy asks for it."""
    strategy = value_of(overrides, STRATEGY_KEY)
    engine = value_of(overrides, "model_engine")
    if strategy != "megatron":
        return list(overrides)
    if engine is None:
        return ["model_engine=megatron", *overrides]
    if engine != "megatron":
        raise UserError(
            f"{STRATEGY_KEY}=megatron contradicts model_engine={engine}: drop model_engine or set model_engine=megatron"
        )
    return list(overrides)


def rewrite_main_argv(argv: list[str], orig_argv: list[str]) -> bool:
    """In ``python -m verl.trainer.main_ppo ...`` rewrite ``argv`` in place; True when changed."""
    try:
        i = orig_argv.index("-m")
    except ValueError:
        return False
    if i + 1 >= len(orig_argv) or orig_argv[i + 1] not in MAIN_MODULES:
        return False
    new = rewrite(argv[1:])
    if new == argv[1:]:
        return False
    argv[1:] = new
    return True
