"""The rollout's precision (ROLLOUT_DTYPE) and the old-log-prob pass (ROLLOUT_CORRECTION) of the launch scripts, and
what the dry run refuses of them before Ray, one line each (docs/VERL_PLUGIN.md, "Cheaper rollouts")."""

from __future__ import annotations

import os
import subprocess

import pytest

from test_rollout_graph import A2, H100, R, ROOT, dry_run, printed_args, sizes, value

pytest.importorskip("verl")
C = "algorithm.rollout_correction"


def test_the_variables_set_verls_keys():
    # decoupled by default where the samples are off-policy (the scripts' ASYNC=colocate) or FP8; off in sync mode
    assert value(printed_args(H100), f"{C}.rollout_is") == "token"
    assert value(printed_args(H100, ASYNC="off"), f"{C}.bypass_mode") is None
    fp8 = printed_args(H100, ASYNC="off", ROLLOUT_DTYPE="fp8")
    assert value(fp8, f"{R}.quantization") == "fp8" and value(fp8, f"{C}.rollout_is") == "token"
    bypass = printed_args(A2, ROLLOUT_CORRECTION="bypass")
    assert [value(bypass, f"{C}.{k}") for k in ("bypass_mode", "rollout_is", "rollout_rs")] == ["True", "null", "null"]
    for env, line in (({"ROLLOUT_DTYPE": "int8"}, "error: ROLLOUT_DTYPE=int8 is not accepted: accepted are bf16, fp8"),
                      ({"ROLLOUT_CORRECTION": "skip"},
                       "error: ROLLOUT_CORRECTION=skip is not accepted: accepted are off, decoupled, bypass")):
        p = subprocess.run(["bash", str(ROOT / "configs" / H100)], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "DRY_RUN": "1", **env})
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [line]


@pytest.mark.parametrize("script, env, want", [
    (H100, {"ROLLOUT_DTYPE": "fp8"}, {"rollout_dtype": "fp8", "old_log_prob": "recomputed"}),
    (H100, {"ROLLOUT_CORRECTION": "bypass", "ROUTER_REPLAY": "R3"}, {"old_log_prob": "rollout's (bypass)"}),
    (A2, {"ROLLOUT_CORRECTION": "bypass"}, {"rollout_dtype": "bf16", "old_log_prob": "rollout's (bypass)"}),
])
def test_cheaper_rollouts_compose(script, env, want, monkeypatch, capsys):
    from mcore_dapo.megatron_compat import supports_routing_replay

    if env.get("ROUTER_REPLAY") == "R3" and not supports_routing_replay():
        pytest.skip("megatron-core without routing replay refuses R3 (test_verl_plugin.py)")
    rc, out, err = dry_run(monkeypatch, capsys, script, **env)
    assert rc == 0, err[-2000:]
    got = sizes(out)
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("script, env, overrides, line", [
    (A2, {"ROLLOUT_DTYPE": "fp8"}, [],
     f"{R}.quantization=fp8 on trainer.device=npu is not accepted: verl's FP8 rollout runs on CUDA (H100 and newer); "
     "accepted here is null (bf16)"),
    (H100, {"ROLLOUT_DTYPE": "fp8", "ROLLOUT_CORRECTION": "bypass"}, [],
     f"{R}.quantization=fp8 needs token-level importance sampling against the FP8 rollout (verl's FP8 document): "
     f"accepted is {C}.rollout_is=token with bypass_mode=False (got rollout_is=None, bypass_mode=True)"),
    (H100, {"ROLLOUT_DTYPE": "fp8"}, [f"{C}.rollout_is=sequence"],
     f"{R}.quantization=fp8 needs token-level importance sampling against the FP8 rollout (verl's FP8 document): "
     f"accepted is {C}.rollout_is=token with bypass_mode=False (got rollout_is=sequence, bypass_mode=False)"),
    (A2, {}, [f"{R}.quantization=ascend"],
     f"{R}.quantization=ascend is not accepted: verl 0.9.1 re-quantizes a weight sync on the fly only for fp8 (CUDA) "
     "and vllm-ascend's MX types, not for the INT8 W8A8 rollout of A2, whose int8 parameters would take the sync's "
     "bf16 tensors; accepted is null (bf16)"),
    (H100, {}, [f"{R}.quantization=torchao"], f"{R}.quantization=torchao is not accepted: accepted is null (bf16) "
                                               "or fp8"),
    (H100, {"ROLLOUT_CORRECTION": "bypass"}, [f"{C}.rollout_rs=seq_mean_k3"],
     f"{C}.bypass_mode=True with rollout_rs=seq_mean_k3: verl 0.9.1's v1 trainer applies no rollout correction in "
     "bypass mode (the PPO ratio against the rollout's log-probs is the correction); accepted with bypass are "
     f"{C}.rollout_is=null and rollout_rs=null, or bypass_mode=False"),
    (H100, {"ROLLOUT_CORRECTION": "bypass", "ROUTER_REPLAY": "R2"}, [],
     f"{C}.bypass_mode=True with router_replay.mode=R2 is not accepted: R2 records its routes in the old-log-prob "
     "pass that bypass skips (verl refuses it); accepted are R3 or disabled, or bypass_mode=False"),
])
def test_refused_in_one_line_before_ray(script, env, overrides, line, monkeypatch, capsys):
    from mcore_dapo.megatron_compat import supports_routing_replay

    if env.get("ROUTER_REPLAY") and not supports_routing_replay():
        pytest.skip("megatron-core without routing replay refuses router replay first (test_verl_plugin.py)")
    rc, out, err = dry_run(monkeypatch, capsys, script, *overrides, **env)
    assert rc == 2, out[-2000:]
    assert err.strip().splitlines() == [f"error: {line}"]
