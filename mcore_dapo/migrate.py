"""``mcore-dapo migrate SCRIPT``: a verl FSDP launch (the guide's, verl 0.6.x) as a verl 0.9.1 Megatron launch.

The table :data:`RULES` is the one place where the FSDP-era keys and their Megatron replacements live:
``migrate`` applies it, the entry point (:mod:`mcore_dapo.verl_plugin.main_dapo`) refuses with it the keys that
do not compose under ``actor.strategy=megatron``, and docs/VERL_PLUGIN.md's table is checked against it by a test.

What ``migrate`` does with a launch:

1. reads it: a bash script (its variable assignments, ``export`` lines and the ``python3 -m
   recipe.dapo.main_dapo`` / ``verl.trainer.main_ppo`` command, expanded as bash would: ``${VAR}``,
   ``${VAR:-default}``, ``$((arithmetic))``, quotes, line continuations) or a file of ``key=value`` overrides;
2. rewrites each override through :data:`RULES` (renamed, dropped with the reason, or derived); an override
   the table does not name is kept when verl 0.9.1's Megatron config has its key, and refused otherwise;
3. adds the Megatron layout and the trainer mode ``mcore-dapo plan`` picks for the script's nodes and device;
4. adds what the project's launch script for that device (``configs/dapo_qwen3_30b_<device>.sh``, read with
   ``PRINT_ARGS=1``) sets and the user's script does not (checkpoint scheduler, background saves, in-flight
   generation batches, the asynchronous trainer's settings), and lists where the user's values differ from it.

The output is a bash script; nothing is written to ``--out`` unless the whole script is made.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import math
import operator
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mcore_dapo.errors import UserError
from mcore_dapo.resources import configs_dir, model_config

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


# ---------------------------------------------------------------------------------------------------------
# Reading a launch: the subset of bash that launch scripts use.

_ASSIGN = re.compile(r"^\s*(?:export\s+)?[A-Za-z_]\w*=")
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass
class Launch:
    source: str
    overrides: list[str]
    exports: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    entry: str | None = None


class _Shell:
    """Expands words the way bash does for the constructs launch scripts use; anything else (command
    substitution, an unset variable under ``set -u``) is one line naming it."""

    def __init__(self, source: str, env: dict[str, str]):
        self.source = source
        self.vars: dict[str, str] = {}
        self.env = env
        self.line = 0

    def _fail(self, what: str) -> UserError:
        return UserError(f"{self.source}:{self.line}: {what}")

    def lookup(self, name: str, default: str | None = None) -> str:
        if name in self.vars:
            return self.vars[name]
        if name in self.env:
            return self.env[name]
        if default is not None:
            return default
        raise self._fail(f"${{{name}}} is used but the script does not set it: set it in the script or the environment")

    def arith(self, expr: str) -> str:
        expr = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: self.lookup(m.group(1)), expr)
        expr = _NAME.sub(lambda m: self.lookup(m.group(0), "0"), expr)
        ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
               ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}

        def ev(n):
            if isinstance(n, ast.Expression):
                return ev(n.body)
            if isinstance(n, ast.Constant) and isinstance(n.value, int):
                return n.value
            if isinstance(n, ast.BinOp) and type(n.op) in ops:
                return ops[type(n.op)](ev(n.left), ev(n.right))
            if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
                return -ev(n.operand)
            raise ValueError
        try:
            return str(ev(ast.parse(expr.strip(), mode="eval")))
        except (ValueError, SyntaxError, ZeroDivisionError):
            raise self._fail(f"$(({expr})) is not an integer expression this reader evaluates") from None

    def dollar(self, s: str, i: int) -> tuple[str, int]:
        """Expand the ``$`` construct at ``s[i]``; (text, index after it)."""
        if s.startswith("$((", i):
            depth, j = 0, i + 1
            while j < len(s):
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                if depth == 0:
                    break
                j += 1
            if j >= len(s) or s[j - 1] != ")":
                raise self._fail(f"unterminated {s[i:i + 20]}")
            return self.arith(s[i + 3:j - 1]), j + 1
        if s.startswith("$(", i) or s.startswith("$`", i):
            raise self._fail(f"command substitution {s[i:i + 30]}... is not evaluated: write the value itself")
        if s.startswith("${", i):
            j = s.find("}", i)
            if j < 0:
                raise self._fail(f"unterminated {s[i:i + 20]}")
            body = s[i + 2:j]
            m = re.fullmatch(r"([A-Za-z_]\w*)(?::?-(.*))?", body, re.S)
            if not m:
                raise self._fail(f"${{{body}}} is not a form this reader expands (${{VAR}}, ${{VAR:-default}})")
            default = self.expand_text(m.group(2)) if m.group(2) is not None else None
            return self.lookup(m.group(1), default), j + 1
        if s.startswith("$@", i) or s.startswith("$*", i):
            return "\0@", i + 2
        m = _NAME.match(s, i + 1)
        if m:
            return self.lookup(m.group(0)), m.end()
        return "$", i + 1

    def expand_text(self, s: str) -> str:
        return self.expand_until(s, 0, None)[0]

    def expand_until(self, s: str, i: int, stop: str | None) -> tuple[str, int]:
        """``s`` from ``i`` up to ``stop`` (or the end) as bash expands a double-quoted word: ``$`` forms and the
        backslash escapes of ``" \\ $ ` ``; (text, index of ``stop`` or ``len(s)``)."""
        out = []
        while i < len(s) and s[i] != stop:
            if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in '"\\$`':
                out.append(s[i + 1])
                i += 2
            elif s[i] == "$":
                t, i = self.dollar(s, i)
                out.append(t)
            else:
                out.append(s[i])
                i += 1
        return "".join(out), i

    def words(self, s: str) -> list[str]:
        words, cur, have, i = [], [], False, 0
        while i < len(s):
            c = s[i]
            if c in " \t\n":
                if have:
                    words.append("".join(cur))
                cur, have, i = [], False, i + 1
            elif c == "#" and not have:
                j = s.find("\n", i)
                i = len(s) if j < 0 else j
            elif c == ";" or c == "&" or c == "|":
                if have:
                    words.append("".join(cur))
                words.append(c)
                cur, have, i = [], False, i + 1
            elif c == "'":
                j = s.find("'", i + 1)
                if j < 0:
                    raise self._fail("unterminated single quote")
                cur.append(s[i + 1:j])
                have, i = True, j + 1
            elif c == '"':
                text, j = self.expand_until(s, i + 1, '"')
                if j >= len(s):
                    raise self._fail("unterminated double quote")
                cur.append(text)
                have, i = True, j + 1
            elif c == "\\":
                if i + 1 < len(s) and s[i + 1] != "\n":
                    cur.append(s[i + 1])
                    have = True
                i += 2
            elif c == "$":
                t, i = self.dollar(s, i)
                cur.append(t)
                have = True
            else:
                cur.append(c)
                have, i = True, i + 1
        if have:
            words.append("".join(cur))
        return words


def _logical_lines(text: str):
    """(first line number, line) with backslash-newline continuations joined."""
    buf, start = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = n
        if line.rstrip().endswith("\\") and not line.lstrip().startswith("#"):
            buf.append(line.rstrip()[:-1] + " ")
            continue
        buf.append(line)
        yield start, "".join(buf)
        buf, start = [], None
    if buf:
        yield start, "".join(buf)


def _entry(words: list[str]) -> int | None:
    """Index of the first override after ``python -m <entry module>`` in ``words``."""
    for i in range(len(words) - 2):
        if Path(words[i]).name.startswith("python") and words[i + 1] == "-m" and words[i + 2] in ENTRY_MODULES:
            return i + 2
    return None


def read_launch(path: str | Path, env: dict[str, str] | None = None) -> Launch:
    """The overrides (expanded), exports and variables of a launch script, or of a file of overrides."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"SCRIPT={str(path)!r} cannot be read ({e.strerror}): accepted is a bash launch script "
                        "or a file of key=value overrides") from None
    sh = _Shell(path.name, dict(os.environ) if env is None else env)
    launch: Launch | None = None
    exports: dict[str, str] = {}
    for n, line in _logical_lines(text):
        sh.line = n
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if any(f"-m {m}" in re.sub(r"\s+", " ", line) for m in ENTRY_MODULES):
            words = sh.words(line)
            i = _entry(words)
            if i is not None:
                args = []
                for w in words[i + 1:]:
                    if w in (";", "&", "|"):
                        break
                    if w != "\0@":
                        args.append(w.replace("\0@", ""))
                if launch is not None:
                    raise UserError(f"{path.name}:{n}: a second verl command: accepted is a script with one")
                launch = Launch(path.name, args, entry=words[i])
                continue
        if _ASSIGN.match(line) and not launch:
            words = sh.words(line)
            is_export = words and words[0] == "export"
            for w in words[1:] if is_export else words:
                if w in (";", "&", "|"):
                    break
                name, eq, value = w.partition("=")
                if not eq or not _NAME.fullmatch(name):
                    break
                sh.vars[name] = value
                if is_export:
                    exports[name] = value
    if launch is None:
        launch = _overrides_file(path.name, text, sh)
    launch.exports, launch.variables = exports, dict(sh.vars)
    return launch


def _overrides_file(name: str, text: str, sh: _Shell) -> Launch:
    words = [w for n, line in _logical_lines(text) for w in (setattr(sh, "line", n) or sh.words(line))]
    if words and all(re.match(r"^[+~]*[A-Za-z_][\w.]*[\w]=", w) and "." in w.partition("=")[0] for w in words):
        return Launch(name, words)
    raise UserError(f"{name} has no verl command: accepted is a bash launch running python3 -m "
                    f"{' / '.join(ENTRY_MODULES)}, or a file of key=value overrides")


# ---------------------------------------------------------------------------------------------------------
# Rewriting


@dataclass
class Line:
    override: str | None  # None: a dropped key (its comment only)
    comment: str = ""
    section: str = "kept"


def _same(a: str, b: str) -> bool:
    import yaml

    def parse(v):
        try:
            return yaml.safe_load(v.strip("'\""))
        except yaml.YAMLError:
            return v
    return a == b or parse(a) == parse(b)


def _truthy(v: str | None) -> bool:
    return str(v).strip("'\"").lower() in ("true", "1", "yes")


def rewrite(overrides: list[str]) -> tuple[list[Line], list[str]]:
    """The overrides through :data:`RULES`: (lines of the new launch, keys kept without a rule)."""
    strategy = value_of(overrides, STRATEGY_KEY)
    if strategy is not None and strategy.strip("'\"") not in STRATEGIES:
        raise UserError(f"{STRATEGY_KEY}={strategy} is not accepted: accepted are {', '.join(STRATEGIES)}")
    lines, unruled = [], []
    for o in overrides:
        prefix, key, value = split_override(o)
        if key == STRATEGY_KEY:
            lines.append(Line(f"{key}=megatron", f"was {value}: verl's Megatron engine through mcore_dapo's plugin"
                              if value != "megatron" else ""))
            continue
        if key == "model_engine":
            continue  # implied by strategy=megatron (mcore_dapo/verl_plugin/overrides.py)
        rule = rule_for(key)
        if rule is None:
            lines.append(Line(o))
            unruled.append(key)
            continue
        new = rule.target(key)
        if new is None:
            lines.append(Line(None, f"dropped {key}={value}: {rule.why}", "dropped"))
        elif key == EP_KEY:
            lines.append(Line(f"{new}={_rollout_ep(overrides, value)}", f"was {key}={value}: {rule.why}", "renamed"))
        elif key == "data.gen_batch_size":
            if not _truthy(value_of(overrides, "algorithm.filter_groups.enable")):
                lines.append(Line(None, f"dropped {key}={value}: filter groups are off, verl 0.9.1's v1 trainer "
                                  "fetches train_batch_size prompts a step", "dropped"))
                continue
            train = value_of(overrides, "data.train_batch_size")
            try:
                n = max(1, math.ceil(int(value) / int(train)))
            except (TypeError, ValueError):
                raise UserError(f"data.gen_batch_size={value} with data.train_batch_size={train} is not accepted: "
                                "accepted are two integers") from None
            lines.append(Line(f"{new}={n}", f"was {key}={value}: {rule.why}", "renamed"))
        else:
            plus = "+" if rule.add else ""
            lines.append(Line(f"{plus}{new}={value}", f"was {key}: {rule.why}", "renamed"))
    if any(split_override(o)[1].startswith("reward_model.overlong_buffer.") for o in overrides) \
            and value_of(overrides, "reward.reward_kwargs.max_resp_len") is None:
        resp = value_of(overrides, "data.max_response_length")
        if resp is not None:
            lines.append(Line(f"+reward.reward_kwargs.max_resp_len={resp}", "the DAPO reward manager's overlong "
                              "penalty needs the response limit (data.max_response_length) in verl 0.9.1", "renamed"))
    return lines, unruled


EP_KEY = "actor_rollout_ref.rollout.enable_expert_parallel"
ROLLOUT_TP_DEFAULT = 2  # verl 0.9.1's rollout.yaml tensor_model_parallel_size


def _rollout_ep(overrides: list[str], value: str) -> int:
    """verl 0.9.1's ``rollout.expert_parallel_size`` for the guide's ``enable_expert_parallel``: TP x DP on, 1 off."""
    flag = str(value).strip("'\"").lower()
    if flag not in ("true", "false"):
        raise UserError(f"{EP_KEY}={value} is not accepted: accepted are True and False")
    if flag == "false":
        return 1
    sizes = []
    for key, default in (("actor_rollout_ref.rollout.tensor_model_parallel_size", ROLLOUT_TP_DEFAULT),
                         ("actor_rollout_ref.rollout.dp_model_parallel_size", None),
                         ("actor_rollout_ref.rollout.data_parallel_size", 1)):
        v = value_of(overrides, key)
        if v is None:
            if default is not None:
                sizes.append(default)
            continue
        try:
            sizes.append(int(v))
        except ValueError:
            raise UserError(f"{key}={v} is not accepted with {EP_KEY}=True: accepted is an integer") from None
        if key.endswith("dp_model_parallel_size"):
            break  # the guide's DP key; verl's own (data_parallel_size) only when it is absent
    return math.prod(sizes)


def verl_megatron_config() -> dict:
    """verl's own resolved config of the Megatron path (``verl/trainer/config/_generated_ppo_megatron_trainer.yaml``,
    which verl's CI keeps equal to what Hydra composes), read without importing verl."""
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("verl is not installed: migrate reads verl 0.9.1's config (pip install -r "
                        "requirements/lock-verl.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config" / "_generated_ppo_megatron_trainer.yaml"
    if not path.is_file():
        raise UserError(f"{path} is missing: accepted is verl 0.9.1, whose wheel has it")
    return yaml.safe_load(path.read_text())


def unknown_keys(keys: list[str], overrides: list[str], cfg: dict | None = None) -> list[str]:
    """Those of ``keys`` that verl 0.9.1's Megatron config does not have (a ``+key`` needs its parent there)."""
    cfg = verl_megatron_config() if cfg is None else cfg
    missing = object()

    def node(parts: list[str]):
        n = cfg
        for part in parts:
            if not isinstance(n, dict) or part not in n:
                return missing
            n = n[part]
        return n

    plus = {split_override(o)[1] for o in overrides if o.startswith("+")}
    out = []
    for k in keys:
        parts = k.split(".")
        if k.startswith("hydra.") or node(parts) is not missing:
            continue
        if k in plus and isinstance(node(parts[:-1]), dict):
            continue
        out.append(k)
    return out


# ---------------------------------------------------------------------------------------------------------
# Layout, trainer mode and the launch script's settings

LAYOUT_KEY = re.compile(r"^actor_rollout_ref\.(actor|ref)\.megatron\.((tensor|pipeline|virtual_pipeline|context|expert|"
                        r"expert_tensor)_model_parallel_size|(pipeline|tensor|expert|expert_tensor|context)_"
                        r"parallel_size|override_transformer_config\.(num_layers_in_(first|last)_pipeline_stage|"
                        r"recompute_\w+))$")
PLAN_DEVICE = {"npu": "a2", "cuda": "h100"}
RECIPE = {"a2": "dapo_qwen3_30b_a2.sh"}  # every other device: the H100 script
MODES = {"colocate_async": "colocate", "separate_async": "separate", "sync": "off"}


@dataclass
class Plan:
    command: str
    layout: str
    overrides: list[str]
    mode: str
    rollout_nodes: int | None
    fits_gib: float


ACTOR_OFFLOAD = ("actor_rollout_ref.actor.megatron.param_offload", "actor_rollout_ref.actor.megatron.optimizer_offload")
GPU_SHARE = "actor_rollout_ref.rollout.gpu_memory_utilization"


def script_offload(overrides: list[str]) -> str:
    """The planner's offload (plan/workload.py OFFLOAD) of the actor's offload settings (verl's defaults: off); the
    FSDP script's ``fsdp_config`` keys are renamed to these by :data:`RULES` before."""
    par, opt = (_truthy(value_of(overrides, k)) for k in ACTOR_OFFLOAD)
    return {(False, False): "none", (False, True): "optimizer", (True, False): "param",
            (True, True): "param+optimizer"}[(par, opt)]


def _fitting(cfg, w):
    from mcore_dapo.plan import plan

    samples = w.prompts * w.responses_per_prompt
    ranked = plan(cfg, w)
    return next((c for c in ranked if c.fits and samples % c.layout.layout.dp(w.world_size) == 0), None)


MORE_OFFLOAD = {"none": ("optimizer", "param", "param+optimizer"), "optimizer": ("param+optimizer",),
                "param": ("param+optimizer",), "param+optimizer": ()}
MAX_NODES = 16  # how far a script that fits nowhere is searched for the node count it would fit on


def what_would_fit(cfg, w) -> str:
    """What makes a workload that fits nowhere fit: more of the actor's offload on the same devices, else the
    smallest node count (up to :data:`MAX_NODES`) with the script's own settings."""
    from dataclasses import replace

    for more in MORE_OFFLOAD[w.offload]:
        if _fitting(cfg, replace(w, offload=more)) is not None:
            par, opt = more in ("param", "param+optimizer"), more in ("optimizer", "param+optimizer")
            return (f"with offload {more} ({ACTOR_OFFLOAD[0].replace('megatron', 'fsdp_config')}={par}, "
                    f"{ACTOR_OFFLOAD[1].replace('megatron', 'fsdp_config')}={opt}) it fits")
    for nodes in range(w.nodes + 1, MAX_NODES + 1):
        if _fitting(cfg, replace(w, nodes=nodes)) is not None:
            return f"on {nodes} nodes (trainer.nnodes={nodes}) it fits"
    return (f"neither more offload nor up to {MAX_NODES} nodes makes it fit: lower {GPU_SHARE} or "
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu")


def plan_for(overrides: list[str], device: str, model: str | None) -> Plan:
    """The best fitting layout (and trainer mode) of ``mcore-dapo plan`` for the launch's nodes and device, with the
    script's own actor offload, vLLM share, micro-batch tokens, lengths and batch."""
    from mcore_dapo.bridge import load_hf_config
    from mcore_dapo.plan import Workload, get_device
    from mcore_dapo.plan.modes import GUIDE, project
    from mcore_dapo.plan.planner import verl_overrides

    def num(key, default, kind=int):
        v = value_of(overrides, key)
        try:
            return kind(str(v).strip("'\"")) if v is not None else default
        except ValueError:
            raise UserError(f"{key}={v} is not accepted: {'an integer' if kind is int else 'a number'} is") from None

    nodes, per_node = num("trainer.nnodes", 1), num("trainer.n_gpus_per_node", 8)
    from mcore_dapo.resources import model_path

    model_dir = model_path(model) if model else _model_dir(value_of(overrides, "actor_rollout_ref.model.path"))
    cfg = load_hf_config(model_dir)
    w = Workload(get_device(device), nodes=nodes, devices_per_node=per_node,
                 max_prompt=num("data.max_prompt_length", 2048), max_response=num("data.max_response_length", 6144),
                 micro_batch_tokens=num("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384),
                 prompts=num("data.train_batch_size", 32), responses_per_prompt=num("actor_rollout_ref.rollout.n", 16),
                 offload=script_offload(overrides), gpu_memory_utilization=num(GPU_SHARE, 0.5, float))
    command = (f"mcore-dapo plan --model {model_dir} --nodes {nodes} --devices-per-node {per_node} --device {device} "
               f"--offload {w.offload} --gpu-memory-utilization {w.gpu_memory_utilization} --micro-batch-tokens "
               f"{w.micro_batch_tokens} --max-prompt {w.max_prompt} --max-response {w.max_response} --prompts "
               f"{w.prompts} --responses-per-prompt {w.responses_per_prompt}")
    best = _fitting(cfg, w)
    if best is None:
        raise UserError(f"no Megatron layout of {model_dir} fits {nodes} x {per_node} {device} devices with the "
                        f"script's offload {w.offload}, {GPU_SHARE}={w.gpu_memory_utilization}, "
                        f"{w.micro_batch_tokens} tokens a micro-batch and responses up to {w.max_response} ({command} "
                        f"lists why); accepted is a launch that fits: {what_would_fit(cfg, w)}")
    modes = project(cfg, w, GUIDE, best.time.total_s)
    split = modes[0].detail if modes[0].mode == "separate_async" else {}
    keep = [o for o in verl_overrides(best, w) if LAYOUT_KEY.match(split_override(o)[1])]
    return Plan(command, best.layout.describe(), keep, MODES[modes[0].mode], split.get("rollout_nodes"),
                best.peak_gib)


def _model_dir(path: str | None) -> str:
    """The model's folder when it is on this machine, else the project's copy of Qwen3-30B-A3B's config."""
    if path and (Path(path.strip("'\"")) / "config.json").is_file():
        return path.strip("'\"")
    return str(model_config())


def recipe_overrides(device: str, launch_overrides: list[str], p: Plan) -> tuple[str, list[str]]:
    """(script name, overrides) of the project's launch script for ``device``, printed by it (``PRINT_ARGS=1``)
    with the user's paths, nodes and the plan's trainer mode."""
    name = RECIPE.get(device, "dapo_qwen3_30b_h100.sh")
    script = configs_dir() / name
    env = {k: v for k, v in os.environ.items() if k not in ("DRY_RUN",)}
    for var, key in (("MODEL_PATH", "actor_rollout_ref.model.path"), ("CKPTS_DIR", "trainer.default_local_dir"),
                     ("TRAIN_FILE", "data.train_files"), ("TEST_FILE", "data.val_files"), ("NNODES", "trainer.nnodes")):
        v = value_of(launch_overrides, key)
        if v is not None:
            env[var] = v.strip("'\"")
    env.update(PRINT_ARGS="1", ASYNC=p.mode)
    if p.rollout_nodes:
        env["ROLLOUT_NNODES"] = str(p.rollout_nodes)
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"{name} did not print its overrides: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return name, [x for x in r.stdout.split("\n") if x]


@dataclass
class Migration:
    script: str
    plan: Plan
    recipe: str
    lines: list[Line]
    differs: dict[str, tuple[str | None, str | None]]  # key: (the user's value, the launch script's)
    exports: dict[str, str]
    own_layout: bool = False  # the script set Megatron sizes itself: kept, the planner's layout only named

    @property
    def overrides(self) -> list[str]:
        return [x.override for x in self.lines if x.override is not None]

    def render(self, args: list[str]) -> str:
        out = ["#!/usr/bin/env bash",
               f"# {self.script} for verl 0.9.1 on the Megatron path (mcore_dapo's verl plugin), written by",
               f"#   mcore-dapo migrate {' '.join(shlex.quote(a) for a in args)}",
               "# Check it without Ray or devices:  DRY_RUN=1 bash THIS_SCRIPT",
               (f"# Layout: the script's own Megatron sizes, kept; the planner's best here is {self.plan.layout}, of"
                if self.own_layout else
                f"# Layout: {self.plan.layout} (peak {self.plan.fits_gib:.0f} GiB a device, the planner's estimate), the best of"),
               f"#   {self.plan.command}",
               f"#   trainer mode {self.plan.mode} (ASYNC={self.plan.mode} of the project's launch scripts)",
               f"# Settings of configs/{self.recipe} (the project's launch for this device) that the script did not",
               "#   have are added below; where the script's values differ from it, the script's are kept:"]
        for k, (mine, theirs) in sorted(self.differs.items()):
            out.append(f"#   {k}: {mine if mine is not None else '(not set)'}  (launch script: "
                       f"{theirs if theirs is not None else 'not set'})")
        if not self.differs:
            out.append("#   (none)")
        out += ["set -euo pipefail", ""]
        for k, v in self.exports.items():
            out.append(f"export {k}={shlex.quote(v)}")
        model = value_of(self.overrides, "actor_rollout_ref.model.path") or ""
        out += ["# a dry run on a machine without the model reads its config.json from the project's copy",
                f"if [ ! -f {shlex.quote(model.strip(chr(39) + chr(34)))}/config.json ]; then",
                f"    export MCORE_DAPO_MODEL_CONFIG=\"${{MCORE_DAPO_MODEL_CONFIG:-{model_config()}}}\"",
                "fi", "", "ARGS=("]
        titles = {"kept": "the script's settings", "renamed": "renamed for verl 0.9.1's Megatron path",
                  "dropped": "dropped",
                  "layout": "layout: the script's own" if self.own_layout else
                  f"layout: {self.plan.layout}, from {self.plan.command}",
                  "added": f"added: configs/{self.recipe}'s settings the script did not have"}
        for section in ("kept", "renamed", "dropped", "layout", "added"):
            group = [x for x in self.lines if x.section == section]
            if not group:
                continue
            out.append(f"    # --- {titles[section]}")
            for x in group:
                if x.comment:
                    out.append(f"    # {x.comment}")
                if x.override is not None:
                    out.append(f"    {shlex.quote(x.override)}")
        out += [")", f"python3 -m {NEW_ENTRY} \"${{ARGS[@]}}\" \"$@\"", ""]
        return "\n".join(out)


def migrate(script: str | Path, device: str | None = None, model: str | None = None) -> Migration:
    launch = read_launch(script)
    lines, unruled = rewrite(launch.overrides)
    kept = [x.override for x in lines if x.override is not None]
    unknown = unknown_keys(unruled, launch.overrides)
    if unknown:
        raise UserError(f"{launch.source}: {', '.join(unknown)} is not known: neither verl 0.9.1's Megatron config "
                        "has it nor the migration table (mcore_dapo/migrate.py RULES); accepted are verl 0.9.1 keys "
                        "and the table's")
    trainer_device = (value_of(kept, "trainer.device") or "cuda").strip("'\"")
    if device is None:
        if trainer_device not in PLAN_DEVICE:
            raise UserError(f"trainer.device={trainer_device} is not accepted: accepted are npu, cuda (or --device)")
        device = PLAN_DEVICE[trainer_device]
    p = plan_for(kept, device, model)
    mine = {split_override(o)[1]: split_override(o)[2] for o in kept}
    # a script that already sets Megatron sizes keeps them (the planner's best is named beside them)
    own_layout = [x for x in lines if x.override is not None and LAYOUT_KEY.match(split_override(x.override)[1])]
    for x in own_layout:
        x.section = "layout"
    if not own_layout:
        lines += [Line(o, section="layout") for o in p.overrides]
    recipe, theirs = recipe_overrides(device, kept, p)
    differs: dict[str, tuple[str | None, str | None]] = {}
    for o in theirs:
        _, key, value = split_override(o)
        if key == "model_engine" or LAYOUT_KEY.match(key):
            continue
        if key not in mine:
            lines.append(Line(o, section="added"))
        elif not _same(mine[key], value):
            differs[key] = (mine[key], value)
    recipe_keys = {split_override(o)[1] for o in theirs}
    for key, value in mine.items():
        if key not in recipe_keys and not LAYOUT_KEY.match(key):
            differs[key] = (value, None)
    return Migration(launch.source, p, recipe, lines, differs, launch.exports, bool(own_layout))


def write_atomically(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--out {str(path)!r} cannot be written ({e.strerror}): accepted is a file path in a "
                        "writable folder") from None


def main(a) -> int:
    m = migrate(a.script, a.device, a.model)
    text = m.render([a.script] + (["--device", a.device] if a.device else []))
    if a.json:
        print(json.dumps({"overrides": m.overrides, "differs": {k: list(v) for k, v in m.differs.items()},
                          "layout": m.plan.layout, "own_layout": m.own_layout, "mode": m.plan.mode,
                          "recipe": m.recipe}))
    if a.out:
        write_atomically(a.out, text)
        print(f"wrote {a.out}: {len(m.overrides)} overrides, layout {m.plan.layout}, trainer mode {m.plan.mode}; "
              f"{len(m.differs)} values differ from configs/{m.recipe}", flush=True)
    elif not a.json:
        print(text, end="")
    return 0
