"""The launch vocabulary: verl's entry modules and strategy key, Hydra override parsing, the FSDP-era key rules
(:data:`RULES`, the one table of the guide's keys and their Megatron replacements) and verl 0.9.1's trainer modes with
the launch scripts' name for each (``ASYNC`` in configs/dapo/common.sh, checked against it by a test). The plugin's
entry point, the planner, ``migrate`` and ``tiny-dapo`` read it; it imports nothing of verl, torch or Megatron."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

ENTRY_MODULES = ("recipe.dapo.main_dapo", "verl.trainer.main_ppo", "mcore_dapo.verl_plugin.main_dapo")
NEW_ENTRY = "mcore_dapo.verl_plugin.main_dapo"
STRATEGY_KEY = "actor_rollout_ref.actor.strategy"
STRATEGIES = ("fsdp", "fsdp2", "megatron")


@dataclass(frozen=True)
class Rule:
    """One FSDP-era key. ``pattern``: the key without its ``+``/``++`` prefix (``*`` within a path);
    ``to``: the Megatron key (``None``: dropped); ``why``: the reason, printed beside it in the output;
    ``composes``: whether verl 0.9.1 composes the old key on the Megatron path at all (the entry point refuses
    those that do not, all in one line); ``add``: the new key takes a ``+`` (not in verl's schema)."""

    pattern: str
    to: str | None
    why: str
    composes: bool = False
    add: bool = False

    def target(self, key: str) -> str | None:
        """The new key for ``key`` (``*`` in ``to`` takes what ``*`` matched in the pattern)."""
        if self.to is None:
            return None
        if "*" not in self.to:
            return self.to
        m = re.fullmatch(re.escape(self.pattern).replace(r"\*", "([^.]+)"), key)
        parts = iter(m.groups() if m else ())
        return re.sub(r"\*", lambda _: next(parts), self.to)


# verl 0.6.x (the guide's FSDP script) -> verl 0.9.1 on Megatron. Read in verl 0.9.1:
# verl/trainer/config/_generated_ppo_megatron_trainer.yaml (what composes), verl/workers/config/engine.py
# (McoreEngineConfig), verl/experimental/reward_loop/reward_loop.py (the legacy reward_model.reward_manager),
# verl/trainer/ppo/v1/trainer_base.py (data.gen_batch_size and max_num_gen_batches under filter groups),
# verl/workers/config/rollout.py (RolloutConfig: data_parallel_size, expert_parallel_size).
RULES: tuple[Rule, ...] = (
    Rule("actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.megatron.param_offload",
         "Megatron's parameter offload"),
    Rule("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "actor_rollout_ref.actor.megatron.optimizer_offload",
         "Megatron's optimizer offload"),
    Rule("actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.ref.megatron.param_offload",
         "Megatron's parameter offload"),
    Rule("actor_rollout_ref.actor.fsdp_config.model_dtype", "actor_rollout_ref.actor.megatron.dtype",
         "the Megatron engine's dtype"),
    Rule("actor_rollout_ref.*.fsdp_config.*", None, "FSDP only: the Megatron layout replaces FSDP's sharding"),
    Rule("actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad",
         "the Megatron optimizer's gradient clipping"),
    Rule("actor_rollout_ref.*.ulysses_sequence_parallel_size", None,
         "FSDP only: Megatron's sequence split is the layout's context_parallel_size"),
    Rule("actor_rollout_ref.*.use_torch_compile", None,
         "FSDP only: verl 0.9.1's Megatron engine does not read it (verl/workers/engine/megatron)", composes=True),
    Rule("reward_model.reward_manager", "reward.reward_manager.name",
         "verl 0.9.1's key (the old one is copied over by verl/experimental/reward_loop/reward_loop.py)",
         composes=True),
    Rule("reward_model.overlong_buffer.*", "reward.reward_kwargs.overlong_buffer_cfg.*",
         "verl 0.9.1's DAPO reward manager takes its overlong buffer as a reward_kwargs entry, beside "
         "max_resp_len (data.max_response_length, added)", add=True),
    Rule("actor_rollout_ref.rollout.dp_model_parallel_size", "actor_rollout_ref.rollout.data_parallel_size",
         "verl 0.9.1's rollout data parallelism (vLLM's data_parallel_size a replica)"),
    Rule("actor_rollout_ref.rollout.rollout_world_size", None,
         "verl 0.9.1 makes (rollout devices) / (TP x DP) replicas itself (verl/workers/rollout/llm_server.py)"),
    Rule("actor_rollout_ref.rollout.enable_expert_parallel", "actor_rollout_ref.rollout.expert_parallel_size",
         "True -> TP x DP, False -> 1: verl 0.9.1 asserts expert_parallel_size is 1 or TP x DP and starts vLLM with "
         "enable_expert_parallel above 1 (verl/workers/config/rollout.py, vllm_async_server.py)"),
    Rule("data.gen_batch_size", "algorithm.filter_groups.max_inflight_gen_batches",
         "with filter groups, verl 0.9.1's v1 trainer sets gen_batch_size to 1 and bounds the prompts in flight "
         "by max_inflight_gen_batches x train_batch_size (gen_batch_size / train_batch_size, rounded up)",
         composes=True),
    Rule("algorithm.filter_groups.max_num_gen_batches", None,
         "ignored by verl 0.9.1's v1 trainer (a warning); max_inflight_gen_batches bounds the refills", composes=True),
)


def markdown_table() -> str:
    """docs/VERL_PLUGIN.md's table of the guide's keys (a test checks the doc holds exactly this)."""
    rows = ["| guide (verl 0.6.x, FSDP) | verl 0.9.1, Megatron | why |", "|---|---|---|"]
    for r in RULES:
        to = f"`{'+' if r.add else ''}{r.to}`" if r.to else "dropped"
        rows.append(f"| `{r.pattern}` | {to} | {r.why}{'' if r.composes else ' (refused under strategy=megatron)'} |")
    return "\n".join(rows)


def rule_for(key: str) -> Rule | None:
    """The first rule whose pattern matches ``key`` (without its ``+`` prefix)."""
    key = key.lstrip("+~")
    return next((r for r in RULES if fnmatch.fnmatchcase(key, r.pattern) and _same_depth(r.pattern, key)), None)


def _same_depth(pattern: str, key: str) -> bool:
    return pattern.count(".") == key.count(".")


def split_override(o: str) -> tuple[str, str, str]:
    """(prefix ``+``/``++``/``~``, key, value) of a Hydra override."""
    m = re.match(r"^([+~]*)([^=]*)=?(.*)$", o, re.S)
    return m.group(1), m.group(2), m.group(3)


def value_of(overrides: list[str], key: str) -> str | None:
    """The value the last override of ``key`` sets (``+``/``~`` prefixes and quotes stripped), None without one;
    also the plugin's rewrite of the overrides (:mod:`mcore_dapo.verl_plugin.overrides`)."""
    found = None
    for o in overrides:
        k, sep, v = o.lstrip("+~").partition("=")
        if sep and k == key:
            found = v.strip("'\"")
    return found


def replacement(rule: Rule, key: str) -> str:
    new = rule.target(key)
    return f"-> {'+' if rule.add else ''}{new}" if new else f"dropped: {rule.why}"


def fsdp_keys(overrides: list[str]) -> list[str]:
    """``key -> replacement`` for each override that does not compose on verl 0.9.1's Megatron path (the
    entry point's one-line refusal under ``actor.strategy=megatron``)."""
    out = []
    for o in overrides:
        _, key, _ = split_override(o)
        rule = rule_for(key)
        if rule is not None and not rule.composes:
            out.append(f"{key} {replacement(rule, key)}")
    return out


# verl 0.9.1's registered v1 trainers (trainer.v1.trainer_mode) -> the launch scripts' ASYNC for each
TRAINER_MODES = {"sync": "off", "colocate_async": "colocate", "separate_async": "separate"}
