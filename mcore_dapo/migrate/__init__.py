"""``mcore-dapo migrate SCRIPT``: a verl FSDP launch (the guide's, verl 0.6.x) as a verl 0.9.1 Megatron launch.

The table :data:`mcore_dapo.launch_keys.RULES` holds the FSDP-era keys and their Megatron replacements:
``migrate`` applies it, the entry point (:mod:`mcore_dapo.verl_plugin.main_dapo`) refuses with it the keys that
do not compose under ``actor.strategy=megatron``, and docs/VERL_PLUGIN.md's table is checked against it by a test.

What ``migrate`` does with a launch:

1. reads it (:mod:`mcore_dapo.migrate.bash_reader`): a bash script (its variable assignments, ``export`` lines and the ``python3 -m
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

import json
import math
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mcore_dapo.errors import UserError
from mcore_dapo.launch_keys import (NEW_ENTRY, RULES, STRATEGIES, STRATEGY_KEY, TRAINER_MODES, rule_for,
                                    split_override, value_of)
from mcore_dapo.migrate.bash_reader import read_launch
from mcore_dapo.resources import configs_dir, model_config


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
    return Plan(command, best.layout.describe(), keep, TRAINER_MODES[modes[0].mode], split.get("rollout_nodes"),
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
                        "has it nor the migration table (mcore_dapo/launch_keys.py RULES); accepted are verl 0.9.1 keys "
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
    from mcore_dapo.io.output import write_text_atomically

    try:
        write_text_atomically(path, text, mode=0o755)
    except OSError as e:
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
