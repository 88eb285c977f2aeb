"""tools/sweep.py with a fake launch command: runs go on after an OOM or a failure, results are tabulated."""

import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mcore_dapo.cli.analysis import main as cli

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "tools" / "sweep.py"
FAKE = REPO / "tests" / "fixtures" / "metrics" / "fake_verl.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep_tool", SWEEP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def test_a_sweep_survives_oom_and_failure(tmp_path):
    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps([{"tp": 1}, {"tp": 2, "ep": 4, "etp": 1}, {"tp": 4}, {"ep": 2}]))
    cmd = f"{sys.executable} {FAKE} --steps {{steps}} --oom-when tp=4 --fail-when ep=2 {{overrides}}"
    p = subprocess.run([sys.executable, str(SWEEP), "--layouts", str(layouts), "--command", cmd, "--steps", "3",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr
    rows = _rows(tmp_path / "out")
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "failed"]
    assert [r["steps"] for r in rows] == ["3", "3", "1", "0"]
    assert "OutOfMemoryError" in rows[2]["reason"] and "exit code 3" in rows[3]["reason"]
    assert float(rows[1]["e2e_tps"]) > float(rows[0]["e2e_tps"])  # the fake is faster with more TP x EP
    assert rows[3]["e2e_tps"] == ""
    md = (tmp_path / "out" / "results.md").read_text()
    assert md.count("\n") == 2 + len(rows) and "| oom |" in md
    assert (tmp_path / "out" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "[4/4]" in p.stdout and "2/4 runs ok" in p.stdout


def test_layouts_from_the_planner(sweep, tmp_path, reference_config, capsys, monkeypatch):
    assert cli(["plan", "--model", str(reference_config), "--nodes", "4", "--devices-per-node", "8",
                "--device", "h100", "--top", "3", "--json"]) == 0
    plan = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO(plan))
    cmd = f"{sys.executable} {FAKE} --steps {{steps}} --world-size 32 {{overrides}}"
    assert sweep.main(["--layouts", "-", "--command", cmd, "--steps", "2", "--out", str(tmp_path / "out")]) == 0
    rows = _rows(tmp_path / "out")
    best = json.loads(plan)["candidates"]
    assert [r["layout"] for r in rows] == [c["layout"] for c in best]
    assert all(r["status"] == "ok" for r in rows)
    log = Path(rows[0]["log"]).read_text()
    assert f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={best[0]['ep']}" in log


def test_a_run_past_its_timeout_is_recorded(sweep, tmp_path):
    layouts = tmp_path / "l.json"
    layouts.write_text('[{"tp": 1}]')
    cmd = f"{sys.executable} -c 'import time; time.sleep(30)'"
    args = ["--layouts", str(layouts), "--command", cmd, "--timeout", "1", "--out", str(tmp_path / "o")]
    assert sweep.main(args) == 0
    assert _rows(tmp_path / "o")[0]["status"] == "timeout"


def test_dry_run_prints_commands(sweep, tmp_path, capsys):
    layouts = tmp_path / "l.json"
    layouts.write_text('[{"tp": 2, "pp": 2, "vpp": 2, "first": 3, "last": 1}]')
    assert sweep.main(["--layouts", str(layouts), "--command", "launch {name} tp={tp} ${HOME} {overrides}",
                       "--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "launch tp2-pp2-ep1-etp2-vpp2-first3-last1 tp=2 ${HOME}" in out
    assert "num_layers_in_first_pipeline_stage=3" in out


@pytest.mark.parametrize("content,needle", [
    ("not json", "is not JSON"),
    ('{"candidates": []}', "holds no layouts"),
    ('[{"tp": 0}]', "tp=0 in a layout is not accepted"),
])
def test_bad_layouts_are_one_line(sweep, tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert sweep.main(["--layouts", str(bad), "--command", "true", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
