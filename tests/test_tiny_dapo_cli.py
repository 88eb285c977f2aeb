"""``mcore-dapo tiny-dapo``: bad input is one line (the trainer itself: tests/test_verl_trainer.py)."""

import pytest

from mcore_dapo.cli.main import run


@pytest.mark.parametrize("args, line", [
    (["--rollout", "sglang"], "--rollout='sglang' is not accepted: hf_cpu or vllm"),
    (["--steps", "0"], "--steps=0 is not accepted: at least 1"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, line):
    assert run(["tiny-dapo", "--workdir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {line}"
    assert not any(tmp_path.iterdir())  # refused before anything was prepared
