"""``python -m mcore_dapo.verl_plugin.main_dapo <verl overrides>``: verl's PPO/DAPO trainer on the Megatron path.

The overrides are rewritten (``actor_rollout_ref.actor.strategy=megatron`` implies
``model_engine=megatron``), composed with verl's own Hydra config and checked by
:func:`mcore_dapo.verl_plugin.config_checks.validate`; then verl's ``main_ppo.main`` runs
with the rewritten overrides. ``DRY_RUN=1`` stops after the checks and prints the
resolved Megatron parallel sizes as one JSON line (no Ray, no device); what this
machine's software would refuse on a launch (``refused_here``: packed sequences on
CUDA without Transformer Engine) is in that line, and a launch refuses it before Ray starts.
``MCORE_DAPO_MODEL_CONFIG``: a folder with the model's config.json, used by the
checks when ``actor_rollout_ref.model.path`` is not on this machine (dry runs).
``MCORE_DAPO_CONFIG_OUT=FILE`` with ``DRY_RUN=1``: also write the composed config (YAML,
interpolations unresolved) to FILE.
"""

from __future__ import annotations

import json
import os
import sys

from mcore_dapo.errors import UserError


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose("ppo_trainer", overrides=overrides)


def verl_validate(c) -> None:
    """verl's own checks (those main_ppo runs before starting Ray); errors become one line."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    try:
        validate_config(config=c, use_reference_policy=need_reference_policy(c), use_critic=need_critic(c))
    except (AssertionError, ValueError) as e:
        raise UserError(f"verl rejects the config: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def refuse_fsdp_keys(overrides: list[str]) -> None:
    """Under ``actor.strategy=megatron``, the FSDP-era keys that would not compose, all in one line with their
    replacements (mcore_dapo/launch_keys.py's table), before Hydra stops at the first."""
    from mcore_dapo.launch_keys import STRATEGY_KEY, fsdp_keys, value_of

    if value_of(overrides, STRATEGY_KEY) != "megatron":
        return
    bad = fsdp_keys(overrides)
    if bad:
        raise UserError(f"{len(bad)} key(s) of verl's FSDP path with {STRATEGY_KEY}=megatron: {'; '.join(bad)} "
                        "(mcore-dapo migrate SCRIPT rewrites a whole launch)")


def dry_run(overrides: list[str], here: bool = False):
    """Compose the (rewritten: :func:`overrides.rewrite`) overrides and check; return the resolved parallel sizes
    and the composed config. ``here``: a launch from this machine, which must also have the software the config
    needs (checked before Ray starts)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mcore_dapo.verl_plugin.config_checks import validate

    refuse_fsdp_keys(overrides)
    try:
        c = compose(overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise UserError(f"verl config does not compose: {str(e).splitlines()[0]}") from None
    sizes = validate(c, os.environ.get("MCORE_DAPO_MODEL_CONFIG"), here=here)
    verl_validate(c)
    return sizes, c


def expected_stack(device: str | None) -> dict:
    """The software stack the trainer device's recipe pins, and what of it is missing here (nothing for a
    device without a fixed stack)."""
    from mcore_dapo.devices import get_adapter
    from mcore_dapo.env import stack_report

    if not device:
        return {}
    stack, missing = stack_report(get_adapter(device))
    if not stack:
        return {}
    return {"expected_stack": {i["name"]: " or ".join(i["accepted"]) for i in stack}, "missing": missing}


def main(argv=None) -> int:
    from mcore_dapo.verl_plugin.overrides import rewrite

    try:
        import verl

        from mcore_dapo.verl_plugin.config_checks import check_verl_version

        check_verl_version(getattr(verl, "__version__", "0"))  # before composing: older verl configs differ
        new = rewrite(list(sys.argv[1:] if argv is None else argv))  # the one rewrite: composed here, run by verl
        dry = os.environ.get("DRY_RUN", "0") not in ("", "0")
        sizes, composed = dry_run(new, here=not dry)
        if dry:
            if os.environ.get("MCORE_DAPO_CONFIG_OUT"):
                from omegaconf import OmegaConf

                target = os.environ["MCORE_DAPO_CONFIG_OUT"]
                try:
                    OmegaConf.save(composed, target)
                except OSError as e:
                    raise UserError(f"MCORE_DAPO_CONFIG_OUT={target!r} cannot be written ({e.strerror}): "
                                    "accepted is a file path in a writable folder") from None
            sizes.update(expected_stack(sizes.get("device")))
            if "expected_stack" in sizes:
                print(f"expects on {sizes['device']}: "
                      + ", ".join(f"{k} {v}" for k, v in sizes["expected_stack"].items())
                      + f"; missing here: {len(sizes['missing'])} (mcore-dapo env --device {sizes['device']})")
            print(json.dumps(sizes))
            return 0
        from mcore_dapo import versions

        versions.check_stack()  # torch x megatron-core a tested pair, before Ray (each worker would refuse it)
        from mcore_dapo.verl_plugin.checkpoint import check_resume

        check_resume(composed)  # the checkpoint a resume would load fits this model and layout, before Ray
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from verl.trainer import main_ppo

    from mcore_dapo.runtime.failures import user_error_line

    sys.argv = [sys.argv[0], *new]
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = full_error or "1"  # Hydra raises what the trainer raised, not prints it
    try:
        main_ppo.main()
    except Exception as e:  # a UserError raised in a Ray actor (the engine's checks) is its one line
        line = user_error_line(e)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            return 2
        import traceback

        from mcore_dapo.runtime.failures import exception_line

        traceback.print_exc()  # the full log: this traceback (a Ray error's holds the actor's) and Ray's
        print(f"failed: {exception_line(e)}{_ray_logs()}", file=sys.stderr)  # not a user's mistake: no error:
        return 1
    finally:
        if full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
    return 0


def _ray_logs() -> str:
    """Where this run's Ray workers logged, where Ray says (its session folder), for the one-line summary."""
    try:
        import ray

        node = ray._private.worker._global_node  # Ray has no public call for its session folder
        return f" (Ray's worker logs: {node.get_session_dir_path()}/logs)" if node is not None else ""
    except Exception:
        return ""


if __name__ == "__main__":
    sys.exit(main())
