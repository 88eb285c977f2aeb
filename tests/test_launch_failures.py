"""A failed launch of worker processes is one line: a UserError raised in a rank, in a Ray actor or in vLLM's
engine process reaches the caller as that line; any other exception as the first failing rank's type and
message plus the path of the full log. The launches here are two bare gloo ranks (tests/failing_worker.py,
no Megatron): rank 1 fails, rank 0 then fails in its barrier ("Connection closed by peer")."""

import os
from pathlib import Path

import pytest

from mcore_dapo.errors import UserError
from mcore_dapo.runtime import failures
from mcore_dapo.runtime.launch import LaunchError, torchrun

TESTS = Path(__file__).resolve().parent
LINE = "--widget=7 is not accepted: accepted are 1 to 4"
TYPE_MESSAGE = "_write_item() missing 1 required positional argument: 'serialization_format'"


ENV = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def _launch(error: str, stream: bool = False):
    return torchrun("failing_worker", ["--error", error], 2, timeout=300, env=ENV, stream=stream)


@pytest.fixture
def rank_server(monkeypatch):
    """The suite's starter of ranks (tests/conftest.py) for these launches: their PYTHONPATH is its own."""
    from mcore_dapo.runtime import launch
    from mcore_dapo_checks.rank_server import RankServer

    server = RankServer(extra_env=ENV)
    monkeypatch.setattr(launch, "STARTER", server)
    yield server
    server.close()


@pytest.mark.parametrize("error", ["user", "ray-user"])
def test_a_user_error_of_one_rank_is_its_line(error, monkeypatch):
    """The ``user`` launch also starts on a port another process bound after it was picked (a listening socket held
    on it, as a launch beside it took one in CI: EADDRINUSE): the launch starts again on another port."""
    import socket

    from mcore_dapo.runtime import launch

    picked, real = [], launch.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        first = iter([port] if error == "user" else [])
        monkeypatch.setattr(launch, "free_port", lambda: picked.append(next(first, None) or real()) or picked[-1])
        with pytest.raises(UserError) as e:
            _launch(error)
    assert str(e.value) == LINE
    if error == "user":
        assert len(picked) == 2 and picked[0] == port != picked[1]


@pytest.mark.parametrize("how", ["captured", "streamed", "rank server"])
def test_an_unexpected_error_is_the_first_failing_ranks_type_and_message_and_the_log(how, request):
    """Streamed (the converters' progress bars on the terminal): the ranks' records alone name it, and the
    kept log holds their tracebacks. The suite's rank server gives the same."""
    if how == "rank server":
        request.getfixturevalue("rank_server")
    with pytest.raises(LaunchError) as e:
        _launch("type", how == "streamed")
    msg = str(e.value)
    assert "\n" not in msg
    head, log = msg.split(" (full log: ")
    assert head == f"failing_worker failed with exit code 1: rank 1: TypeError: {TYPE_MESSAGE}"
    text = Path(log.rstrip(")")).read_text()
    assert f"TypeError: {TYPE_MESSAGE}" in text and "Connection closed by peer" in text  # rank 0's, after it
    Path(log.rstrip(")")).unlink()


def test_the_suites_rank_server_starts_the_ranks_torchrun_would(rank_server):
    """tests/conftest.py starts the suite's ranks from mcore_dapo_checks.rank_server (torch and Megatron imported
    once, each rank forked): the reference is torchrun's own launch of the same worker. Each rank gets torchrun's
    variables with its values (but the launch's own: the port, the failures folder, the agent's error file and
    store, which rank 0 hosts here) and a session of its own, runs the module as ``__main__`` from its file in a
    fresh namespace, and draws its own random numbers as a fresh interpreter does (Python's, numpy's and torch's
    generators seeded afresh). Its user errors are their line (below, and test_an_unexpected_error_... for the
    others)."""
    from mcore_dapo.runtime import launch

    per_launch = {"MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "PWD", "_", failures.ENV}
    forked = _launch("none")["ranks"]
    assert rank_server.launches == 1
    with pytest.MonkeyPatch.context() as m:
        m.setattr(launch, "STARTER", None)
        reference = _launch("none")["ranks"]
    base = dict(os.environ)
    for f, t in zip(forked, reference, strict=True):
        torchruns = {k: v for k, v in t["env"].items() if base.get(k) != v and k not in per_launch}
        assert {k: f["env"].get(k) for k in torchruns} == torchruns
        assert f["argv0"] == f["main_file"] == t["argv0"] == str(TESTS / "failing_worker.py") and f["main_run"]
        assert f["main_names"] == t["main_names"]  # a fresh __main__, not the server's
        assert f["own_session"] and t["own_session"]  # torchrun starts each rank in a session of its own
    for draw in ("random", "numpy_random", "torch_random"):  # each interpreter seeds them afresh
        assert len({r[draw] for r in reference}) == len({r[draw] for r in forked}) == 2
    with pytest.raises(UserError) as e:
        _launch("user")
    assert str(e.value) == LINE and rank_server.launches == 2


def test_user_error_line_finds_the_line_in_what_wraps_it():
    import traceback

    from ray.exceptions import RayTaskError

    try:
        raise UserError(LINE)
    except UserError as u:
        tb = "".join(traceback.format_exception(u))
        ray_error = RayTaskError("EngineHost.update", tb, u).as_instanceof_cause()
    assert isinstance(ray_error, UserError) and "\n" in str(ray_error)  # Ray's text: the remote traceback
    assert failures.user_error_line(ray_error) == LINE
    assert failures.user_error_line(RuntimeError(f"Worker failed:\n{tb}")) == LINE  # a wrapper with its text
    try:
        try:
            raise UserError(LINE)
        except UserError as inner:
            raise RuntimeError("engine step failed") from inner
    except RuntimeError as outer:
        assert failures.user_error_line(outer) == LINE
    assert failures.user_error_line(RuntimeError("gloo: Connection closed by peer")) is None


# what vLLM's engine process writes when a weight update raises (ANSI colours, Ray's actor prefix)
VLLM_LOG = (
    "\x1b[36m(EngineHost pid=4242)\x1b[0m ERROR 12-01 17:00:00 [core.py:700] EngineCore encountered a fatal error.\n"
    "\x1b[36m(EngineHost pid=4242)\x1b[0m Traceback (most recent call last):\n"
    "\x1b[36m(EngineHost pid=4242)\x1b[0m   File \"repack_moe_experts.py\", line 41, in _setup_kernel\n"
    f"\x1b[36m(EngineHost pid=4242)\x1b[0m mcore_dapo.errors.UserError: {LINE}\n"
    "[rank0]: Traceback (most recent call last):\n"
    "[rank0]: vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace above.\n"
    "[rank1]: Traceback (most recent call last):\n"
    "[rank1]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer\n"
)


def test_summarize_prefers_a_user_mistake_anywhere_then_the_earliest_rank():
    dead = {"rank": 0, "time": 2.0, "type": "EngineDeadError", "message": "EngineCore encountered an issue."}
    gloo = {"rank": 1, "time": 3.0, "type": "RuntimeError", "message": "Connection closed by peer"}
    assert failures.summarize([dead, gloo], VLLM_LOG).user_error == LINE  # the engine's refusal, from the log
    assert failures.summarize([{"rank": 1, "time": 5.0, "user_error": LINE}, dead], "").user_error == LINE
    first = failures.summarize([dead, gloo], "")
    assert first.user_error is None and first.line == "rank 0: EngineDeadError: EngineCore encountered an issue."
    no_records = failures.summarize([], VLLM_LOG.replace(f"mcore_dapo.errors.UserError: {LINE}", ""))
    assert no_records.line == "rank 0: EngineDeadError: EngineCore encountered an issue. See stack trace above."
    assert failures.summarize([], "starting\nKilled\n").line == "Killed"


def test_a_worker_without_a_record_is_its_tracebacks_exception_also_without_a_message():
    """A worker that records no failure (a harness ending in finish_worker): the log's first traceback gives the
    line, also for an exception without a message (``next()`` of an empty iterator), not torchrun's summary."""
    log = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "w.py", line 3, in <module>',
        "[rank0]:     folder = next(iter(()))",
        "[rank0]:              ^^^^^^^^^^^^^^",
        "[rank0]: StopIteration",
        "Traceback (most recent call last):",
        '  File "run.py", line 9, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
    ])
    assert failures.summarize([], log).line == "rank 0: StopIteration"
    keyed = log.replace("[rank0]: StopIteration", "[rank0]: KeyError: 'step'")
    assert failures.summarize([], keyed).line == "rank 0: KeyError: 'step'"


def test_the_cli_prints_a_failed_launch_as_one_line(capsys):
    from mcore_dapo.cli import user_errors

    @user_errors
    def command():
        raise LaunchError("mcore_dapo.convert.hf2mcore failed with exit code 1: rank 1: TypeError: x (full log: /tmp/l)")

    assert command() == 1
    assert capsys.readouterr().err == ("error: mcore_dapo.convert.hf2mcore failed with exit code 1: rank 1: "
                                      "TypeError: x (full log: /tmp/l)\n")


def test_an_entry_points_log_gives_its_printed_line_or_its_last_exception():
    """tiny-dapo reads main_dapo's log: the line main_dapo printed for a UserError of a Ray actor, else the
    innermost exception of the driver's last traceback (a Ray error's remote one)."""
    printed = f"(TaskRunner pid=7) step 0\nerror: {LINE}\n"
    assert failures.summarize_entry_point_log(printed).user_error == LINE
    ray_log = ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: a warning's traceback\n"
               "Traceback (most recent call last):\n  File \"main_ppo.py\", line 80, in run_ppo\n"
               "ray.exceptions.RayTaskError(KeyError): ray::TaskRunner.run() (pid=9, ip=10.0.0.1)\n"
               "  File \"ray_trainer.py\", line 12, in fit\n"
               "KeyError: 'response_mask'\n")
    why = failures.summarize_entry_point_log(ray_log)
    assert why.user_error is None and why.line == "KeyError: 'response_mask'"
    summary = failures.summarize_entry_point_log(ray_log + "failed: KeyError: 'response_mask' (Ray's worker logs: L)\n")
    assert summary.user_error is None and summary.line == "KeyError: 'response_mask' (Ray's worker logs: L)"


def test_an_unexpected_error_of_a_ray_actor_is_its_own_type_and_message():
    """main_dapo's summary line of a trainer that failed otherwise: the actor's exception, not Ray's wrapper."""
    import traceback

    from ray.exceptions import RayTaskError

    try:
        raise KeyError("response_mask")
    except KeyError as k:
        wrapped = RayTaskError("TaskRunner.run", "".join(traceback.format_exception(k)), k).as_instanceof_cause()
    assert failures.exception_line(wrapped) == "KeyError: 'response_mask'"
    try:
        try:
            raise ValueError("no routes")
        except ValueError as inner:
            raise RuntimeError("update failed") from inner
    except RuntimeError as outer:
        assert failures.exception_line(outer) == "ValueError: no routes"


def test_a_killed_session_leaves_no_process_behind(tmp_path):
    """run_session's kill reaches every process of the session, also one that moved to a process group of its
    own (as Ray's workers do), and returns only when none is left: a killed run writes nothing afterwards."""
    import os
    import sys
    import time

    from mcore_dapo.runtime.launch import run_session

    pidfile = tmp_path / "pid"
    child = (f"import os, time; os.setpgid(0, 0); open({str(pidfile)!r} + '.tmp', 'w').write(str(os.getpid())); "
             f"os.rename({str(pidfile)!r} + '.tmp', {str(pidfile)!r}); time.sleep(60)")
    code = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n"
    start = time.monotonic()
    with open(tmp_path / "log", "w") as sink:
        rc = run_session([sys.executable, "-c", code], dict(os.environ), sink, 30, kill_when=pidfile.is_file)
    assert rc == -9 and time.monotonic() - start < 20
    pid = int(pidfile.read_text())
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = None  # gone
    assert state in (None, "Z"), state


def test_a_picked_port_lies_under_the_kernels_ephemeral_range():
    """Ports the kernel hands out (port 0, outgoing connections, gloo's pairs) come from the ephemeral range; a store's
    port picked under it is not taken by them before torchrun binds it."""
    from mcore_dapo.runtime import launch

    low = launch._ephemeral_low()
    if low <= launch.PORT_FLOOR + 1000:
        pytest.skip(f"this host's ephemeral range starts at {low}: no room under it")
    assert all(launch.PORT_FLOOR <= launch.free_port() < low for _ in range(20))
