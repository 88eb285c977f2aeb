"""verl console metrics: parsing (prefixes, malformed lines, Ray folders), the guide's throughputs,
summaries, comparison and plots."""

import json
import re
from pathlib import Path

import pytest

from mcore_dapo.cli.analysis import main as cli
from mcore_dapo.errors import UserError
from mcore_dapo.metrics import Batch, parse_line, read_run, summarise, with_throughputs
from mcore_dapo.metrics.compare import HIGHER, LOWER, compare
from mcore_dapo.metrics.throughput import world_from_log

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "metrics"
GUIDE_LOG = REPO.parent / "shared" / "seed" / "a2-fsdp-step9.log"


@pytest.fixture(scope="module")
def guide_log() -> Path:
    if not GUIDE_LOG.is_file():
        pytest.skip("the guide's step-9 log (../shared/seed/a2-fsdp-step9.log) is not beside the repository")
    return GUIDE_LOG


def test_guide_e2e_tps_is_the_guide_formula_by_hand(guide_log):
    # step 9's raw fields, read here with a regex (not the parser), in the guide's formula (section 3.3:
    # (response_length_mean + prompt_length_mean) x global_batch_size x n_samples_per_prompt / world_size / time_all)
    # with the guide run's sizes: train_prompt_bsz=32, n_resp_per_prompt=16, NNODES=4 x n_gpus_per_node=8
    raw = {k: float(v) for k, v in re.findall(r"\b(response_length/mean|prompt_length/mean|timing_s/step):([-0-9.e+]+)",
                                              guide_log.read_text())}
    by_hand = (raw["response_length/mean"] + raw["prompt_length/mean"]) * 32 * 16 / (4 * 8) / raw["timing_s/step"]
    assert round(by_hand, 2) == 251.87
    run = read_run(guide_log)
    # without the batch sizes: verl's perf/total_num_tokens over the world size solved from perf/throughput, which
    # must come out as the guide's 32 devices
    assert world_from_log(run.steps[9]) == 4 * 8
    assert with_throughputs(run, Batch())[9]["e2e_tps"] == pytest.approx(by_hand, rel=1e-12)


def test_guide_formula_with_the_batch_sizes_gives_the_same(guide_log):
    # the guide's run: train_batch_size 32, n 16, 4 nodes x 8 devices
    m = with_throughputs(read_run(guide_log), Batch(world_size=32, prompts=32, responses_per_prompt=16))[9]
    assert m["e2e_tps"] == pytest.approx(m["perf/throughput"], rel=1e-12)
    assert m["update_tps"] == pytest.approx(m["e2e_tps"] * m["timing_s/step"] / m["timing_s/update_actor"])
    assert m["vllm_tps"] == pytest.approx(m["e2e_tps"] * m["timing_s/step"] / m["timing_s/gen"])


def test_prefixed_coloured_lines_are_read_and_malformed_ones_counted():
    run = read_run(FIX / "ray_run.log")
    assert sorted(run.steps) == [1, 2, 3, 4, 5]
    assert run.malformed == 2
    assert run.steps[3]["timing_s/update_actor"] == 20.0


@pytest.mark.parametrize("line,expected", [
    ("step:3 - a/b:1.5 - c:2", (3, {"a/b": 1.5, "c": 2.0})),
    ("(WorkerDict pid=9) step:12 - x:1e-3", (12, {"x": 1e-3})),
    ("global_step: 4 saved", None),
    ("no metrics here", None),
    ("step:three - x:1", "malformed"),
    ("step:3 - x", "malformed"),
    ("step:3 - x:abc", "malformed"),  # no numeric value at all
    # verl's validation metrics print as numpy 2 scalars
    ("step:2 - val-core/aime_tiny/acc/mean@1:np.float64(0.375) - n:np.int64(3)",
     (2, {"val-core/aime_tiny/acc/mean@1": 0.375, "n": 3.0})),
])
def test_parse_line(line, expected):
    assert parse_line(line) == expected


def test_a_ray_session_folder_is_searched_and_repeated_steps_kept_once():
    run = read_run(FIX / "ray_session")
    assert sorted(run.steps) == [1, 2, 3, 4]
    assert run.duplicates == 1
    assert len(run.files) == 2  # the driver log and the worker's .out; gcs_server.out has no metric lines


def test_world_size_comes_from_perf_throughput():
    s = summarise(read_run(FIX / "ray_run.log"))
    assert s["tokens_from"] == "perf/total_num_tokens / world size"
    assert s["median"]["e2e_tps"] == pytest.approx(s["median"]["perf/throughput"])


def test_summary_leaves_warm_up_out():
    run = read_run(FIX / "ray_run.log")
    s = summarise(run, warmup_steps=2)
    assert s["steps_summarised"] == [3, 4, 5]
    assert s["median"]["response_length/mean"] == run.steps[4]["response_length/mean"]
    assert summarise(run, warmup_steps=9)["warmup_fallback"] is True


def test_compare_states_directions():
    a = summarise(read_run(FIX / "ray_run.log"))["median"]
    b = summarise(read_run(FIX / "run_b.log"))["median"]
    rows = {r["key"]: r for r in compare(a, b)}
    assert rows["timing_s/step"]["direction"] == LOWER and rows["e2e_tps"]["direction"] == HIGHER
    upd = "timing_s/update_actor"
    assert rows[upd]["ratio"] == pytest.approx(b[upd] / a[upd])
    faster = "B better" if b["timing_s/step"] < a["timing_s/step"] else "A better"
    assert rows["timing_s/step"]["verdict"] == rows["e2e_tps"]["verdict"] == faster


def test_metrics_cli_json_and_plot(tmp_path, capsys):
    png = tmp_path / "m.png"
    assert cli(["metrics", str(FIX / "ray_run.log"), str(FIX / "run_b.log"), "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["malformed_lines"] for r in out["runs"]] == [2, 0]
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20000


def test_metrics_cli_text(capsys):
    assert cli(["metrics", str(FIX / "ray_session"), "--world-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "e2e_tps" in out and "4 steps (1..4) from 2 file(s)" in out


def test_compare_cli(capsys):
    assert cli(["compare", str(FIX / "ray_run.log"), str(FIX / "run_b.log")]) == 0
    out = capsys.readouterr().out
    assert "ratio = B / A" in out and "lower is better" in out and "higher is better" in out


@pytest.mark.parametrize("args,needle", [
    (["metrics", str(FIX / "no_metrics.log")], "no verl metric lines"),
    (["metrics", str(FIX / "missing.log")], "does not exist"),
    (["metrics", str(FIX / "ray_run.log"), "--world-size", "0"], "world_size=0 is not accepted"),
    (["metrics", str(FIX / "ray_run.log"), "--warmup-steps", "-1"], "warmup_steps=-1 is not accepted"),
])
def test_bad_input_is_one_line(capsys, args, needle):
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_an_empty_log_is_a_user_error(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(UserError, match="accepted are verl console logs"):
        read_run(empty)


def test_lines_of_the_same_step_are_merged(tmp_path):
    log = tmp_path / "val.log"
    log.write_text("step:5 - val-core/acc:0.25\nstep:5 - timing_s/step:10.0 - perf/total_num_tokens:800\n")
    run = read_run(log)
    assert run.steps[5] == {"val-core/acc": 0.25, "timing_s/step": 10.0, "perf/total_num_tokens": 800.0}
    assert run.duplicates == 1
    assert with_throughputs(run, Batch(world_size=8))[5]["e2e_tps"] == 10.0


# verl v1 runs (trainer_base.py's metric names): a synchronous one and a colocate_async one on the same cluster
SYNC_V1, COLOCATE_V1 = FIX / "v1_sync.log", FIX / "v1_colocate_async.log"


def test_staleness_and_generation_overlap_per_step():
    from mcore_dapo.metrics.offpolicy import reference_ms_per_token

    ref = reference_ms_per_token(read_run(SYNC_V1))
    assert ref == pytest.approx((0.067722 + 0.067594) / 2)  # the log's steps 2 and 3 (step 1 warms up)
    steps = with_throughputs(read_run(COLOCATE_V1), Batch(), ref)
    assert steps[3]["training/off_policy/trajectory_staleness/mean"] == 0.41
    assert steps[3]["training/off_policy/trajectory_staleness_worst/max"] == 2
    assert steps[3]["gen_wait_share"] == pytest.approx(118.3 / 278.43)
    assert steps[3]["gen_hidden"] == pytest.approx(1 - 0.049271 / 0.067658)
    assert steps[1]["gen_hidden"] == pytest.approx(1 - 0.070173 / 0.067658)  # the first step waits for all
    s = summarise(read_run(COLOCATE_V1), reference_ms=ref)
    assert s["median"]["gen_hidden"] == pytest.approx(1 - 0.049271 / 0.067658)  # steps 2-4: the middle one
    assert s["median"]["training/off_policy/trajectory_staleness/mean"] == 0.38


def test_a_synchronous_run_hides_nothing():
    from mcore_dapo.metrics.offpolicy import reference_ms_per_token

    run = read_run(SYNC_V1)
    steps = with_throughputs(run, Batch(), reference_ms_per_token(run))
    assert [round(steps[s]["gen_hidden"], 6) for s in (2, 3)] == [round(1 - 0.067722 / 0.067658, 6),
                                                                  round(1 - 0.067594 / 0.067658, 6)]
    assert all(abs(steps[s]["gen_hidden"]) < 0.001 for s in (2, 3))
    assert steps[2]["gen_wait_share"] == pytest.approx(163.4 / 324.33)


def test_an_asynchronous_reference_is_refused(capsys):
    assert cli(["metrics", str(COLOCATE_V1), "--sync-reference", str(COLOCATE_V1)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an asynchronous run (its trajectories are stale)" in err


def test_metrics_cli_shows_the_async_columns_and_plots_them(tmp_path, capsys):
    png = tmp_path / "a.png"
    assert cli(["metrics", str(COLOCATE_V1), "--sync-reference", str(SYNC_V1), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    assert {"stale", "wmax", "wait", "hidden"} <= set(head)
    row3 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["3"])
    assert row3[-4:] == ["0.41", "2", f"{118.3 / 278.43:.2f}", f"{1 - 0.049271 / 0.067658:.2f}"]
    assert png.is_file() and png.stat().st_size > 20000
    assert cli(["metrics", str(COLOCATE_V1), "--json"]) == 0
    per_step = json.loads(capsys.readouterr().out)["runs"][0]["per_step"]
    assert "gen_hidden" not in per_step["3"] and per_step["3"]["gen_wait_share"] == pytest.approx(118.3 / 278.43)
