"""The rollout's layout (GEN_TP / GEN_DP / GEN_EP) and graph mode (ENFORCE_EAGER, CUDAGRAPH_MODE) of the launch
scripts, and what the dry run refuses of them before Ray, one line each (docs/VERL_PLUGIN.md, "Rollout layout and
graph mode"; docs/ASCEND.md, "Rollout graph mode")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mcore_dapo.errors import UserError

pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parent.parent
R = "actor_rollout_ref.rollout"
A2, H100 = "dapo_qwen3_30b_a2.sh", "dapo_qwen3_30b_h100.sh"


def printed_args(script: str, **env: str) -> list[str]:
    """The script's overrides (``PRINT_ARGS=1``), as bash composes them."""
    p = subprocess.run(["bash", str(ROOT / "configs" / script)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PRINT_ARGS": "1", **env})
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def value(args: list[str], key: str) -> str | None:
    got = [a.split("=", 1)[1] for a in args if a.lstrip("+").split("=", 1)[0] == key]
    return got[-1] if got else None


def script_env(script: str, **env: str) -> dict:
    """The variables the script exports (its ``python3`` call replaced by ``env``)."""
    shim = 'python3() { env -0; }; export -f python3; exec bash "$@"'
    p = subprocess.run(["bash", "-c", shim, "bash", str(ROOT / "configs" / script)], capture_output=True, timeout=60,
                       env={**os.environ, "DRY_RUN": "1", **env})
    assert p.returncode == 0, p.stderr
    return dict(x.split("=", 1) for x in p.stdout.decode().split("\0") if "=" in x)


def dry_run(monkeypatch, capsys, script: str, *overrides: str, **env: str) -> tuple[int, str, str]:
    """main_dapo with DRY_RUN=1 in this process, on the script's overrides and exported variables."""
    from mcore_dapo.verl_plugin import main_dapo

    args = printed_args(script, **env)
    for k, v in {**script_env(script, **env), "DRY_RUN": "1"}.items():
        if k not in ("_", "SHLVL", "PWD", "OLDPWD") and not k.startswith("BASH_FUNC_") and os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    for k in set(os.environ) - set(script_env(script, **env)) - {"DRY_RUN"}:
        monkeypatch.delenv(k)  # a variable of this shell that the script's environment does not have
    capsys.readouterr()
    rc = main_dapo.main([*args, *overrides])
    out, err = capsys.readouterr()
    return rc, out, err


def sizes(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------
# The scripts' overrides

def test_a2_runs_graph_mode_and_eager_is_one_variable_away():
    args = printed_args(A2)
    assert value(args, f"{R}.enforce_eager") == "False"
    assert value(args, f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_mode") == "PIECEWISE"
    # 3 x 32 prompts x 16 responses in flight over 32 / TP2 = 16 engines: 96 a engine
    assert value(args, f"{R}.cudagraph_capture_sizes") == "[1,2,4,8,16,24,32,40,48,56,64,72,80,88,96]"
    assert script_env(A2)["VLLM_ASCEND_ENABLE_NZ"] == "0" and script_env(A2)["TASK_QUEUE_ENABLE"] == "1"
    eager = printed_args(A2, ENFORCE_EAGER="True")
    assert value(eager, f"{R}.enforce_eager") == "True"
    assert not [a for a in eager if "cudagraph" in a or "compilation_config" in a]


def test_h100_keeps_cuda_graphs_sized_to_the_batch():
    args = printed_args(H100)
    assert value(args, f"{R}.enforce_eager") == "False"
    assert value(args, f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_mode") is None  # verl's default
    assert value(args, f"{R}.cudagraph_capture_sizes") == "[1,2,4,8,16,24,32,40,48,56,64,72,80,88,96]"
    # separate_async: the same batch over the rollout pool's 16 devices, 8 engines: 192 a engine
    sep = value(printed_args(H100, ASYNC="separate"), f"{R}.cudagraph_capture_sizes")
    assert sep.startswith("[1,2,4,8,16,") and sep.endswith(",184,192]")


@pytest.mark.parametrize("script", [A2, H100])
def test_gen_variables_pass_through(script):
    args = printed_args(script, GEN_TP="4", GEN_DP="2", GEN_EP="8")
    assert [value(args, f"{R}.{k}") for k in ("tensor_model_parallel_size", "data_parallel_size",
                                               "expert_parallel_size")] == ["4", "2", "8"]
    args = printed_args(script)
    assert [value(args, f"{R}.{k}") for k in ("tensor_model_parallel_size", "data_parallel_size",
                                               "expert_parallel_size")] == ["2", "1", "1"]


@pytest.mark.parametrize("env, line", [
    ({"GEN_DP": "0"}, "error: GEN_DP=0 is not accepted: accepted is a positive integer"),
    ({"GEN_EP": "two"}, "error: GEN_EP=two is not accepted: accepted is a positive integer"),
    ({"ENFORCE_EAGER": "yes"}, "error: ENFORCE_EAGER=yes is not accepted: accepted are True (eager) and False (graph mode)"),
])
def test_bad_variables_are_refused_by_bash(env, line):
    p = subprocess.run(["bash", str(ROOT / "configs" / H100)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DRY_RUN": "1", **env})
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [line]


# ---------------------------------------------------------------------------------------------------------
# The dry run: what composes, and what is refused in one line

@pytest.mark.parametrize("script, env, want", [
    (A2, {}, {"rollout_graph": "PIECEWISE", "trainer_mode": "colocate_async"}),
    (A2, {"ENFORCE_EAGER": "True"}, {"rollout_graph": "eager"}),
    (A2, {"CUDAGRAPH_MODE": "FULL_DECODE_ONLY"}, {"rollout_graph": "FULL_DECODE_ONLY"}),
    (A2, {"ASYNC": "separate"}, {"rollout_graph": "PIECEWISE", "trainer_mode": "separate_async", "rollout_replicas": 8}),
    (H100, {"ROUTER_REPLAY": "R3"}, {"rollout_graph": "FULL_AND_PIECEWISE", "router_replay": "R3"}),
    (H100, {"ROUTER_REPLAY": "R3", "ASYNC": "separate"}, {"rollout_graph": "FULL_AND_PIECEWISE",
                                                          "trainer_mode": "separate_async"}),
    (H100, {"GEN_DP": "2", "GEN_EP": "4"}, {"rollout_tp": 2, "rollout_dp": 2, "rollout_ep": 4, "rollout_replicas": 8}),
    (H100, {"GEN_TP": "8", "GEN_DP": "2", "GEN_EP": "16"}, {"rollout_ep": 16, "rollout_replicas": 2}),
])
def test_graph_mode_composes(script, env, want, monkeypatch, capsys):
    """Graph mode with router replay R3 and both asynchronous modes (partial rollout) passes the checks: none of
    these combinations is refused by the verl/vLLM source read (config_checks.check_rollout_graph)."""
    from mcore_dapo.megatron_compat import supports_routing_replay

    if env.get("ROUTER_REPLAY") == "R3" and not supports_routing_replay():
        pytest.skip("megatron-core without routing replay refuses R3 (test_verl_plugin.py)")
    rc, out, err = dry_run(monkeypatch, capsys, script, **env)
    assert rc == 0, err[-2000:]
    got = sizes(out)
    assert {k: got[k] for k in want} == want


KV = "neither divides the model's"


@pytest.mark.parametrize("script, env, overrides, line", [
    (H100, {"GEN_EP": "3"}, [],
     f"{R}.expert_parallel_size=3 with tensor_model_parallel_size=2 and data_parallel_size=1 is not accepted: "
     "accepted are 1 (experts tensor-split) and 2 (TP x DP: vLLM's expert parallelism), as verl asserts"),
    (H100, {"GEN_DP": "2", "GEN_EP": "2"}, [],
     f"{R}.expert_parallel_size=2 with tensor_model_parallel_size=2 and data_parallel_size=2 is not accepted: "
     "accepted are 1 (experts tensor-split) and 4 (TP x DP: vLLM's expert parallelism), as verl asserts"),
    (H100, {"GEN_DP": "3"}, [],
     "rollout TP x DP = 2 x 3 = 6 devices a replica on nodes of 8: verl places a replica on one node or on whole "
     "nodes; accepted is a replica size dividing 8 or a multiple of it"),
    (H100, {"GEN_TP": "8", "GEN_DP": "2", "ASYNC": "separate", "ROLLOUT_NNODES": "3"}, [],
     "rollout TP x DP = 16 devices a replica does not divide the rollout's 24 devices (verl would leave 8 idle): "
     "accepted is a divisor of 24"),
    (H100, {"GEN_TP": "3"}, ["trainer.n_gpus_per_node=12", "data.train_batch_size=24",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=24"],
     f"{R}.tensor_model_parallel_size=3 does not divide the model's 32 attention heads (vLLM refuses it): "
     "accepted are 1, 2, 4, 8, 16, 32"),
    (H100, {"CUDAGRAPH_MODE": "FULL_DECODE"}, [],
     f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL_DECODE is not accepted: accepted are vLLM's "
     "NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"),
    (H100, {}, [f"{R}.cudagraph_capture_sizes=[0,8]"],
     f"{R}.cudagraph_capture_sizes=[0, 8] is not accepted: accepted is null (vLLM's sizes) or a list of positive "
     "batch sizes"),
    (A2, {"CUDAGRAPH_MODE": "FULL"}, [],
     f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_mode=FULL with enforce_eager=False on trainer.device=npu: "
     "vllm-ascend runs it eager; accepted are PIECEWISE, FULL_DECODE_ONLY, FULL_AND_PIECEWISE (or enforce_eager=True)"),
    (A2, {"VLLM_ASCEND_ENABLE_NZ": "1"}, [],
     "VLLM_ASCEND_ENABLE_NZ=1 with the vLLM rollout on trainer.device=npu: vllm-ascend then keeps the rollout's "
     "weights in NZ format, which the weight sync of every step does not write; accepted is VLLM_ASCEND_ENABLE_NZ=0 "
     "(or unset: verl sets 0)"),
    (A2, {"VLLM_ASCEND_ENABLE_NZ": "2", "ENFORCE_EAGER": "True"}, [],
     "VLLM_ASCEND_ENABLE_NZ=2 with the vLLM rollout on trainer.device=npu: vllm-ascend then keeps the rollout's "
     "weights in NZ format, which the weight sync of every step does not write; accepted is VLLM_ASCEND_ENABLE_NZ=0 "
     "(or unset: verl sets 0)"),
    (A2, {"ASCEND_LAUNCH_BLOCKING": "1"}, [],
     "ASCEND_LAUNCH_BLOCKING=1 with enforce_eager=False on trainer.device=npu: vllm-ascend refuses ACL graphs with "
     f"it; accepted are ASCEND_LAUNCH_BLOCKING unset or 0, or {R}.enforce_eager=True"),
])
def test_refused_in_one_line_before_ray(script, env, overrides, line, monkeypatch, capsys):
    rc, out, err = dry_run(monkeypatch, capsys, script, *overrides, **env)
    assert rc == 2, out[-2000:]
    assert err.strip().splitlines() == [f"error: {line}"]


def test_what_is_accepted_where_the_refusals_fire(monkeypatch, capsys):
    """The other side of the refusals above: eager with ASCEND_LAUNCH_BLOCKING=1, NZ left unset (verl sets 0)."""
    rc, out, err = dry_run(monkeypatch, capsys, A2, ENFORCE_EAGER="True", ASCEND_LAUNCH_BLOCKING="1")
    assert rc == 0 and sizes(out)["rollout_graph"] == "eager", err[-2000:]
    from omegaconf import OmegaConf

    from mcore_dapo.verl_plugin.config_checks import check_rollout_graph

    c = OmegaConf.create({"trainer": {"device": "npu"},
                          "actor_rollout_ref": {"rollout": {"name": "vllm", "enforce_eager": False}}})
    assert check_rollout_graph(c, env={}) == "PIECEWISE"  # verl's FULL_AND_PIECEWISE, as vllm-ascend runs it
    c.trainer.device = "cuda"
    assert check_rollout_graph(c, env={"VLLM_ASCEND_ENABLE_NZ": "1"}) == "FULL_AND_PIECEWISE"  # an NPU variable
    # vLLM's CPU build: new packed linear weights at every sync (vllm/model_executor/layers/utils.py) and, not eager,
    # one trace of the model (vllm/platforms/cpu.py: DYNAMO_TRACE_ONCE) that keeps the first: eager only
    c.trainer.device = "cpu"
    with pytest.raises(UserError) as e:
        check_rollout_graph(c, env={})
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{R}.enforce_eager=False with the vLLM rollout on "
                                                                 "trainer.device=cpu")
    c.actor_rollout_ref.rollout.enforce_eager = True
    assert check_rollout_graph(c, env={}) == "eager"


def test_kv_heads_and_dp_split_refusals():
    """The refusals no layout of Qwen3-30B-A3B on 8-device nodes reaches: a model whose KV heads neither divide
    nor are divided by the rollout TP, and DP ranks of a TP that does not divide the rollout node."""
    from omegaconf import OmegaConf

    from mcore_dapo.errors import UserError
    from mcore_dapo.verl_plugin.config_checks import check_rollout_layout

    def conf(tp, dp=1, ep=1, per_node=8):
        return OmegaConf.create({"trainer": {"n_gpus_per_node": per_node},
                                 "actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": tp,
                                                                   "data_parallel_size": dp,
                                                                   "expert_parallel_size": ep}}})

    cfg = types.SimpleNamespace(num_attention_heads=24, num_key_value_heads=8, is_moe=True)
    with pytest.raises(UserError) as e:
        check_rollout_layout(conf(6, per_node=6), cfg, 12, "sync")
    assert str(e.value) == (f"{R}.tensor_model_parallel_size=6 neither divides the model's 8 KV heads nor is a "
                            "multiple of them (vLLM splits or replicates whole KV heads): accepted are 1, 2, 4, 8, 24")
    assert check_rollout_layout(conf(2, 3, 6, per_node=6), cfg, 12, "sync")["rollout_replicas"] == 2
    with pytest.raises(UserError) as e:
        c = conf(16, 2, 32, per_node=8)
        c.actor_rollout_ref.rollout.update({"nnodes": 4, "n_gpus_per_node": 8})
        check_rollout_layout(c, types.SimpleNamespace(num_attention_heads=32, num_key_value_heads=4, is_moe=True),
                             32, "separate_async")
    assert str(e.value) == (f"{R}.tensor_model_parallel_size=16 with data_parallel_size=2 on nodes of 8: verl splits a "
                            "node into DP ranks of TP devices; accepted is a TP dividing 8")
    dense = types.SimpleNamespace(num_attention_heads=32, num_key_value_heads=4, is_moe=False)
    with pytest.raises(UserError) as e:
        check_rollout_layout(conf(2, 1, 2), dense, 8, "sync")
    assert str(e.value) == f"{R}.expert_parallel_size=2 needs a model with MoE layers; this one has none: accepted is 1"


def test_tiny_dapo_cpu_runs_stay_eager():
    """The CPU trainer runs source common.sh with ENFORCE_EAGER=True (vLLM's CPU build runs eager): no graph
    settings reach them."""
    from mcore_dapo_checks import tiny_dapo

    env = tiny_dapo.script_env({"model": "/m", "train": "/t", "val": "/v"}, Path("/w"), gen_tp=2)
    assert env["ENFORCE_EAGER"] == "True"
    args = tiny_dapo.script_args(env, [])
    assert value(args, f"{R}.enforce_eager") == "True" and value(args, f"{R}.tensor_model_parallel_size") == "2"
    assert not [a for a in args if "cudagraph" in a or "compilation_config" in a]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
