"""``mcore-dapo migrate``: the guide's FSDP scripts become the project's Megatron launch, and the entry point names
every FSDP key it cannot compose in one line.

The guide's two scripts are read from the guide itself (``../shared/seed/``, beside the repository; skipped where
it is absent). The reference of the migration is what the project's launch script for the device composes
(``DRY_RUN=1``, verl's own Hydra composition, ``MCORE_DAPO_CONFIG_OUT``), and the keys where the two may differ are
written here by hand from reading the guide: its dropout overrides and its run names. The paths are the guide's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
GUIDE = REPO.parent / "shared" / "seed" / "qwen3-30b-a3b-verl-dapo-guide.txt"
BIN = Path(sys.executable).parent

# where the migrated guide may differ from the launch script: the guide's own choices, read in the guide
DROPOUT = {f"actor_rollout_ref.model.override_config.{k}" for k in ("attention_dropout", "embd_pdrop", "resid_pdrop")}
# the guide's A2 rollout ran eager; the launch script runs vllm-ascend's graph mode (docs/ASCEND.md)
DIFFERS = {"a2": DROPOUT | {"trainer.experiment_name", "actor_rollout_ref.rollout.enforce_eager"},
           "h100": DROPOUT | {"trainer.experiment_name", "trainer.project_name"}}
GUIDE_PATHS = {
    "a2": {"actor_rollout_ref.model.path": "/root/work/filestorage/weights_hf/Qwen3-30B-A3B",
           "trainer.default_local_dir": "/root/work/filestorage/ckpt/Qwen3-30B-A3B/1220/",
           "data.train_files": "/root/work/filestorage/datasets/dapo-math-17k.parquet",
           "data.val_files": "/root/work/filestorage/datasets/aime-2024.parquet"},
    "h100": {"actor_rollout_ref.model.path": "/root/work/filestorage/GroupPostTrain/OpenSourceModels/Qwen3-30B-A3B",
             "trainer.default_local_dir": "/root/work/externalstorage/gpfsprd/verl/outputs/DAPO-myconfig/DAPO-Qwen3-30B",
             "data.train_files": "/root/work/externalstorage/gpfsprd/datasets/DAPO-Math-17k/raw/dapo-math-17k.parquet",
             "data.val_files": "/root/work/externalstorage/gpfsprd/datasets/DAPO-Math-17k/dapo-aime24.parquet"},
}
SECTION = {"a2": "3.3.2", "h100": "3.4 H100"}


def guide_script(device: str, out: Path) -> Path:
    """The guide's script for ``device``: from its ``#!/usr/bin/env bash`` after the section's title to the
    command's last line (``... $@``)."""
    if not GUIDE.is_file():
        pytest.skip("the guide (../shared/seed/qwen3-30b-a3b-verl-dapo-guide.txt) is not beside the repository")
    text = GUIDE.read_text()
    start = text.index("#!/usr/bin/env bash", text.index(SECTION[device]))
    end = text.index("$@", start) + 2
    out.write_text(text[start:end] + "\n")
    return out


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):  # an empty section has no leaves (a filled one on the other side has them)
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dry_run(script: Path, out: Path, **env) -> subprocess.CompletedProcess:
    e = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DRY_RUN": "1",
         "MCORE_DAPO_CONFIG_OUT": str(out), **env}
    return subprocess.run(["bash", str(script)], env=e, capture_output=True, text=True, timeout=300)


def mcore_dapo(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "mcore-dapo"), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("device", ["a2", "h100"])
def test_the_guides_script_migrates_to_the_launch_scripts_config(device, tmp_path):
    script = guide_script(device, tmp_path / f"guide-{device}.sh")
    out = tmp_path / "megatron.sh"
    r = mcore_dapo("migrate", str(script), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = __import__("json").loads(r.stdout.splitlines()[0])
    assert set(report["differs"]) == DIFFERS[device], report["differs"]
    assert report["mode"] == "colocate"  # the planner's mode of both launch scripts (ASYNC=colocate)

    got = dry_run(out, tmp_path / "migrated.yaml")
    assert got.returncode == 0, got.stderr[-2000:]
    want = dry_run(REPO / "configs" / f"dapo_qwen3_30b_{device}.sh", tmp_path / "launch.yaml")
    assert want.returncode == 0, want.stderr[-2000:]
    a = flat(yaml.safe_load((tmp_path / "migrated.yaml").read_text()))
    b = flat(yaml.safe_load((tmp_path / "launch.yaml").read_text()))
    from mcore_dapo.migrate import LAYOUT_KEY

    # the layout is the planner's for the guide's own offload and vLLM share (both on, 0.9); the launch scripts'
    # layouts were planned with the planner's defaults (no offload, 0.5), so the layout keys may differ
    differ = {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>") and not LAYOUT_KEY.match(k)}
    # the launch script's paths are its defaults (/data/...); the migrated script keeps the guide's
    assert differ == DIFFERS[device] | GUIDE_PATHS[device].keys(), sorted(differ)
    assert {k: a[k] for k in GUIDE_PATHS[device]} == GUIDE_PATHS[device]
    # the same JSON line of sizes (layout, rollout layout, device, trainer mode) from both dry runs; on A2 the
    # rollout's graph mode is the one difference (the guide's eager kept)
    mine, theirs = (__import__("json").loads(r.stdout.splitlines()[-1]) for r in (got, want))
    if device == "a2":
        assert (mine.pop("rollout_graph"), theirs.pop("rollout_graph")) == ("eager", "PIECEWISE")
    sizes = {k: mine.pop(k, None) for k in ("tp", "pp", "ep", "etp", "expert_tp", "cp", "vpp", "dp", "edp")}
    for k in sizes:
        theirs.pop(k, None)
    assert report["layout"].startswith(f"TP{sizes['tp']} PP{sizes['pp']} EP{sizes['ep']} ETP{sizes['etp']}")
    assert mine == theirs
    assert (mine["rollout_tp"], mine["rollout_dp"], mine["rollout_ep"]) == (2, 1, 1)
    text = out.read_text()
    assert "--offload param+optimizer --gpu-memory-utilization 0.9 --micro-batch-tokens 16384" in text
    assert "# dropped actor_rollout_ref.actor.ulysses_sequence_parallel_size=1: FSDP only" in text
    assert "python3 -m mcore_dapo.verl_plugin.main_dapo \"${ARGS[@]}\" \"$@\"" in text


GUIDE_REFUSED = {  # the guide's keys that verl 0.9.1 does not compose on the Megatron path, and their replacements
    "actor_rollout_ref.actor.fsdp_config.param_offload": "-> actor_rollout_ref.actor.megatron.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "-> actor_rollout_ref.actor.megatron.optimizer_offload",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "-> actor_rollout_ref.ref.megatron.param_offload",
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "-> actor_rollout_ref.actor.megatron.dtype",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": "dropped: FSDP only",
    "actor_rollout_ref.actor.grad_clip": "-> actor_rollout_ref.actor.optim.clip_grad",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "dropped: FSDP only",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "dropped: FSDP only",
    "actor_rollout_ref.rollout.dp_model_parallel_size": "-> actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.rollout_world_size": "dropped: verl 0.9.1 makes (rollout devices) / (TP x DP) replicas",
    "actor_rollout_ref.rollout.enable_expert_parallel": "-> actor_rollout_ref.rollout.expert_parallel_size",
    "reward_model.overlong_buffer.enable": "-> +reward.reward_kwargs.overlong_buffer_cfg.enable",
    "reward_model.overlong_buffer.len": "-> +reward.reward_kwargs.overlong_buffer_cfg.len",
    "reward_model.overlong_buffer.penalty_factor": "-> +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
}


def test_the_guides_fsdp_keys_under_megatron_are_one_line_naming_all(tmp_path):
    """The guide's A2 overrides with only the strategy, the entry point and the layout changed: one line naming
    each FSDP key with its replacement; without those keys the same overrides compose and pass the checks (so the
    line named every key that would have failed)."""
    from mcore_dapo.migrate import read_launch

    launch = read_launch(guide_script("a2", tmp_path / "guide.sh"), env={})
    layout = [f"actor_rollout_ref.{r}.megatron.{k}={v}" for r in ("actor", "ref")
              for k, v in (("pipeline_model_parallel_size", 2), ("expert_model_parallel_size", 8))]
    overrides = [o.replace("strategy=fsdp", "strategy=megatron") for o in launch.overrides] + layout
    env = {**os.environ, "DRY_RUN": "1", "MCORE_DAPO_MODEL_CONFIG": str(REPO / "configs" / "models" / "qwen3-30b-a3b")}
    cmd = [sys.executable, "-m", "mcore_dapo.verl_plugin.main_dapo"]
    r = subprocess.run([*cmd, *overrides], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    line = r.stderr.strip()
    assert line.startswith(f"error: {len(GUIDE_REFUSED)} key(s) of verl's FSDP path"), line
    for key, replacement in GUIDE_REFUSED.items():
        assert f"{key} {replacement}" in line, key
    rest = [o for o in overrides if o.lstrip("+").partition("=")[0] not in GUIDE_REFUSED]
    r = subprocess.run([*cmd, *rest], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


ROLLOUT = "actor_rollout_ref.rollout"


@pytest.mark.parametrize("edit, want", [
    ({}, {"data_parallel_size": "1", "expert_parallel_size": "1"}),  # the guide's: gen_dp=1, EP off
    ({"gen_dp=1": "gen_dp=2", "enable_expert_parallel=False": "enable_expert_parallel=True"},
     {"data_parallel_size": "2", "expert_parallel_size": "4"}),  # TP2 x DP2
    ({"enable_expert_parallel=False": "enable_expert_parallel=True"},
     {"data_parallel_size": "1", "expert_parallel_size": "2"}),
])
def test_the_guides_rollout_layout_becomes_verls_keys(edit, want, tmp_path):
    """The guide's A2 rollout keys (``+dp_model_parallel_size=${gen_dp}``, ``+enable_expert_parallel=False``)
    become verl 0.9.1's ``data_parallel_size`` and ``expert_parallel_size`` (TP x DP when on, else 1: what verl's
    RolloutConfig accepts); ``rollout_world_size`` is dropped with its reason."""
    from mcore_dapo.launch_keys import value_of
    from mcore_dapo.migrate import read_launch, rewrite

    script = guide_script("a2", tmp_path / "guide.sh")
    text = script.read_text()
    for a, b in edit.items():
        assert a in text, a
        text = text.replace(a, b)
    script.write_text(text)
    lines, _ = rewrite(read_launch(script, env={}).overrides)
    new = [x.override for x in lines if x.override]
    assert {k: value_of(new, f"{ROLLOUT}.{k}") for k in want} == want
    assert not [o for o in new if "dp_model_parallel_size" in o or "enable_expert_parallel" in o
                or "rollout_world_size" in o]
    dropped = [x.comment for x in lines if x.section == "dropped" and "rollout_world_size" in x.comment]
    assert dropped == [f"dropped {ROLLOUT}.rollout_world_size=32: verl 0.9.1 makes (rollout devices) / (TP x DP) "
                       "replicas itself (verl/workers/rollout/llm_server.py)"]


def test_a_bad_expert_parallel_flag_is_one_line():
    from mcore_dapo.errors import UserError
    from mcore_dapo.migrate import rewrite

    with pytest.raises(UserError) as e:
        rewrite([f"{ROLLOUT}.tensor_model_parallel_size=2", f"+{ROLLOUT}.enable_expert_parallel=yes"])
    assert str(e.value) == f"{ROLLOUT}.enable_expert_parallel=yes is not accepted: accepted are True and False"


def test_the_table_agrees_with_verls_megatron_config():
    """A rule is refused at the entry point exactly where verl 0.9.1's Megatron config lacks the key (its
    generated config, the file verl keeps equal to what Hydra composes), checked on concrete keys of each rule."""
    from mcore_dapo.launch_keys import RULES
    from mcore_dapo.migrate import verl_megatron_config

    pytest.importorskip("verl")
    cfg = flat(verl_megatron_config())
    parents = {k.rpartition(".")[0] for k in cfg} | {p for k in cfg for p in _prefixes(k)}
    for rule in RULES:
        key = rule.pattern.replace("*.fsdp_config.*", "actor.fsdp_config.wrap_policy").replace("*", "actor")
        present = key in cfg or key in parents
        assert present == rule.composes, (rule.pattern, present)
        if rule.to is not None:  # the replacement is verl's key, or one verl lacks that the table adds with +
            to = rule.target(key)
            assert (to in cfg) != rule.add, (to, rule.add)


def _prefixes(key: str):
    parts = key.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts)))


def test_the_docs_table_is_the_rules():
    from mcore_dapo.launch_keys import markdown_table

    doc = (REPO / "docs" / "VERL_PLUGIN.md").read_text()
    assert markdown_table() in doc, ("docs/VERL_PLUGIN.md's table differs from mcore_dapo.launch_keys.RULES: paste "
                                     "python -c 'from mcore_dapo.launch_keys import markdown_table; print(markdown_table())'")


SCRIPT = r'''#!/usr/bin/env bash
set -xeuo pipefail
n=16   # a comment
len=$((1024 * 6))
half=$(( len / 2 ))
name="run-${n}"
path=${DATA_DIR:-/d}/train.parquet
export VLLM_USE_V1=1
python3 -m verl.trainer.main_ppo \
    data.train_files="${path}" \
    actor_rollout_ref.rollout.n=$n \
    data.max_response_length=${len} \
    trainer.experiment_name='${name}' \
    trainer.project_name="$name" \
    'trainer.logger=["console"]' \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$half $@
'''


def test_the_launch_is_read_as_bash_expands_it(tmp_path):
    from mcore_dapo.migrate import read_launch

    (tmp_path / "run.sh").write_text(SCRIPT)
    launch = read_launch(tmp_path / "run.sh", env={})
    # what bash itself passes: the reference
    got = subprocess.run(["bash", "-c", SCRIPT.replace("python3 -m verl.trainer.main_ppo", "printf '%s\\n'")
                          .replace("set -xeuo", "set -euo")], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert launch.overrides == got.stdout.splitlines()
    assert launch.exports == {"VLLM_USE_V1": "1"} and launch.entry == "verl.trainer.main_ppo"
    assert read_launch(tmp_path / "run.sh", env={"DATA_DIR": "/x"}).overrides[0] == "data.train_files=/x/train.parquet"


BAD = [
    ("echo hello\n", "run.sh has no verl command: accepted is a bash launch running python3 -m recipe.dapo.main_dapo"),
    ("python3 -m recipe.dapo.main_dapo actor_rollout_ref.actor.strategy=ddp\n",
     "actor_rollout_ref.actor.strategy=ddp is not accepted: accepted are fsdp, fsdp2, megatron"),
    ("python3 -m recipe.dapo.main_dapo trainer.no_such_key=1 actor_rollout_ref.actor.strategy=fsdp\n",
     "run.sh: trainer.no_such_key is not known: neither verl 0.9.1's Megatron config has it nor the migration table"),
    ("x=$(hostname)\npython3 -m recipe.dapo.main_dapo a.b=$x\n",
     "run.sh:1: command substitution $(hostname)... is not evaluated: write the value itself"),
    ("python3 -m recipe.dapo.main_dapo a.b=${UNSET_VAR_OF_NOBODY}\n",
     "run.sh:1: ${UNSET_VAR_OF_NOBODY} is used but the script does not set it"),
]


@pytest.mark.parametrize("text,line", BAD, ids=["no-command", "strategy", "unknown-key", "substitution", "unset"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, text, line):
    (tmp_path / "run.sh").write_text(text)
    out = tmp_path / "out.sh"
    r = mcore_dapo("migrate", "run.sh", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {line}") and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.sh*"))


def test_an_overrides_file_migrates(tmp_path):
    """A file of key=value overrides (no script around them) is read as the overrides; its strategy is
    rewritten and an FSDP key renamed; Megatron sizes it sets itself are kept, not the planner's."""
    (tmp_path / "o.txt").write_text("actor_rollout_ref.actor.strategy=fsdp\n# offload\n"
                                    "actor_rollout_ref.actor.fsdp_config.param_offload=True\ntrainer.nnodes=4\n")
    r = mcore_dapo("migrate", str(tmp_path / "o.txt"), "--device", "h100", "--json")
    assert r.returncode == 0, r.stderr
    got = __import__("json").loads(r.stdout.splitlines()[0])["overrides"]
    assert "actor_rollout_ref.actor.strategy=megatron" in got
    assert "actor_rollout_ref.actor.megatron.param_offload=True" in got
    assert not [o for o in got if "fsdp_config" in o]
    (tmp_path / "o.txt").write_text("actor_rollout_ref.actor.strategy=megatron\ntrainer.nnodes=4\n"
                                    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4\n")
    r = mcore_dapo("migrate", str(tmp_path / "o.txt"), "--device", "h100", "--json")
    assert r.returncode == 0, r.stderr
    out = __import__("json").loads(r.stdout.splitlines()[0])
    sizes = [o for o in out["overrides"] if ".megatron." in o and "_parallel_size=" in o]
    assert out["own_layout"] and sizes == ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"], sizes


def guide_on(nodes: int, tmp_path: Path, offload: str = "True") -> Path:
    """The guide's A2 script with ``NNODES`` (and its ``offload`` variable) changed."""
    script = guide_script("a2", tmp_path / f"guide-{nodes}.sh")
    text = script.read_text()
    assert "\nNNODES=4\n" in text and "\noffload=True\n" in text
    script.write_text(text.replace("\nNNODES=4\n", f"\nNNODES={nodes}\n").replace("\noffload=True\n", f"\noffload={offload}\n"))
    return script


def test_a_two_node_script_migrates_with_its_own_offload(tmp_path):
    """The guide's A2 script on 2 nodes fits as written (param and optimizer offload, vLLM share 0.9): migrate plans
    with the script's settings, not the planner's defaults (no offload, 0.5), under which nothing fits."""
    r = mcore_dapo("migrate", str(guide_on(2, tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    report = __import__("json").loads(r.stdout.splitlines()[0])
    assert report["layout"] == "TP2 PP1 EP8 ETP1" and not report["own_layout"]
    assert "actor_rollout_ref.actor.megatron.param_offload=True" in report["overrides"]


@pytest.mark.parametrize("nodes, offload, advice", [
    (2, "False", "accepted is a launch that fits: with offload param+optimizer (actor_rollout_ref.actor.fsdp_config."
                 "param_offload=True, actor_rollout_ref.actor.fsdp_config.optimizer_offload=True) it fits"),
    (1, "True", "accepted is a launch that fits: on 2 nodes (trainer.nnodes=2) it fits"),
])
def test_a_script_that_fits_nowhere_names_what_would_fit(tmp_path, nodes, offload, advice):
    r = mcore_dapo("migrate", str(guide_on(nodes, tmp_path, offload)), "--json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: no Megatron layout of ") and f"fits {nodes} x 8 a2 devices" in r.stderr
    assert f"--offload {'param+optimizer' if offload == 'True' else 'none'} --gpu-memory-utilization 0.9" in r.stderr
    assert r.stderr.strip().endswith(advice), r.stderr


def test_the_plan_takes_the_scripts_micro_batch_lengths_and_offload():
    from mcore_dapo.migrate import plan_for

    p = plan_for(["trainer.nnodes=4", "data.max_response_length=8192", "data.max_prompt_length=1024",
                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480", "actor_rollout_ref.actor.megatron."
                  "param_offload=True", "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"], "h100", None)
    assert ("--offload param --gpu-memory-utilization 0.7 --micro-batch-tokens 20480 --max-prompt 1024 "
            "--max-response 8192") in p.command


def test_the_scripts_async_names_are_the_launch_vocabularys():
    """configs/dapo/common.sh spells each of verl's trainer modes by the ASYNC name mcore_dapo.launch_keys gives it:
    the case's arms, the mode each sets, and the accepted list of its refusal."""
    import re

    from mcore_dapo.launch_keys import TRAINER_MODES

    text = (REPO / "configs" / "dapo" / "common.sh").read_text()
    block = text[text.index('case "${ASYNC:-off}" in'):]
    block = block[:block.index("\nesac")]
    arms = re.findall(r"^    ([a-z]+)\)", block, re.M)
    assert arms == list(TRAINER_MODES.values())
    for mode, name in TRAINER_MODES.items():
        arm = block[block.index(f"    {name})"):]
        arm = arm[:arm.index(";;")]
        assert (f"trainer.v1.trainer_mode={mode}" in arm) == (mode != "sync"), (mode, arm)
    assert f"accepted are {', '.join(TRAINER_MODES.values())}" in block
