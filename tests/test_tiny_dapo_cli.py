"""``mcore-dapo tiny-dapo``: bad input is one line (the trainer itself: tests/test_verl_trainer.py)."""

import pytest

from mcore_dapo.cli.main import run


@pytest.mark.parametrize("args, line", [
    (["--rollout", "sglang"], "--rollout='sglang' is not accepted: hf_cpu or vllm"),
    (["--steps", "0"], "--steps=0 is not accepted: at least 1"),
    (["--rollout", "hf_cpu", "--router-replay", "R4"], "--router-replay='R4' is not accepted: accepted are off, R2, R3"),
    (["--rollout", "vllm", "--router-replay", "R3"], "--router-replay R3 with --rollout vllm: R3 replays the rollout's "
     "routed experts, which vLLM's CPU build cannot return (its Model Runner V2 needs Triton); accepted on the CPU "
     "is --rollout hf_cpu"),
    (["--rollout-dtype", "fp8"], "--rollout-dtype='fp8' is not accepted: bfloat16 or float32"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert run(["tiny-dapo", "--workdir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {line}"
    assert not any(tmp_path.iterdir())  # refused before anything was prepared
