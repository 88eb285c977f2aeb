"""Start a module under torchrun from Python (tests, demo, tools) and read its JSON result."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from mcore_dapo.errors import UserError


# A listening port for a launch (torchrun's store) is picked under the kernel's ephemeral range: a port the kernel
# hands out (bind to port 0, an outgoing connection, gloo's own pairs) may be taken by any process in the window
# between picking it and torchrun binding it, and with two launches side by side it was (EADDRINUSE).
PORT_FLOOR = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A port free on 127.0.0.1 now, under the ephemeral range where the host has one (Linux), else any."""
    import random

    low = _ephemeral_low()
    for _ in range(64 if low > PORT_FLOOR + 1000 else 0):
        port = random.randrange(PORT_FLOOR, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_TAKEN = ("failed to listen", "EADDRINUSE")  # torch's TCPStore, its port bound by another process
PORT_TRIES = 3


def peak_rss_mb() -> float:
    """This process's peak resident memory, in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class LaunchError(RuntimeError):
    pass


USER_ERROR = "user_error"


def torchrun(module: str, args: list[str], nproc: int, *, timeout: float | None = 600, env: dict | None = None,
             stream: bool = False) -> dict:
    """Run ``python -m module args --out F`` in ``nproc`` processes; return rank 0's JSON from F.

    ``stream``: let the processes write to this terminal (progress bars) instead of capturing.
    The processes run in a session of their own, their output goes to a file (not a pipe), and every
    process of the session is killed once torchrun returns or ``timeout`` passes: a rank that died
    leaves no helper process behind (torch_dist's multiprocessing manager, say) to hold the launch.

    A failed launch is one line (:mod:`mcore_dapo.runtime.failures`): a :class:`UserError` raised in a
    rank, in a Ray actor or in vLLM's engine is raised here as that line; anything else is a
    :class:`LaunchError` naming the first failing rank's exception type and message and the path of
    the full log, kept after the run.
    """
    from mcore_dapo.runtime import failures

    with tempfile.TemporaryDirectory(prefix="mcore-dapo-run-") as tmp:
        out = Path(tmp) / "result.json"
        failed = Path(tmp) / "failures"
        failed.mkdir()
        full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    "PYTHONWARNINGS": "ignore", **(env or {}), failures.ENV: str(failed)}
        log = Path(tmp) / "output.log"
        returncode, cmd, text = run_torchrun(nproc, ["-m", module, *args, "--out", str(out)], full_env, log,
                                             timeout, out, stream=stream)
        if returncode != 0 or not out.is_file():
            records = failures.read_records(failed)
            why = failures.summarize(records, text)
            if why.user_error is not None:
                raise UserError(why.user_error)
            kept = failures.keep_log(module.rsplit(".", 1)[-1], f"$ {' '.join(cmd)}\n{text}",
                                     records if stream else [])  # streamed: the terminal had the output
            what = "timed out" if returncode is None else f"failed with exit code {returncode}"
            raise LaunchError(f"{module} {what}: {why.line} (full log: {kept})")
        result = json.loads(out.read_text())
    if isinstance(result, dict) and USER_ERROR in result:
        raise UserError(result[USER_ERROR])
    return result


def run_torchrun(nproc: int, argv: list[str], env: dict, log: Path, timeout: float | None, out: Path,
                 stream: bool = False) -> tuple[int | None, list[str], str]:
    """``python -m torch.distributed.run`` of ``argv`` on ``nproc`` local processes (:func:`run_session`), its output
    to ``log`` (``stream``: to this terminal); started again on another port where torch's store failed to listen on a
    taken one and ``out`` was not written. Returns the exit code, the command last run and the log's text ('' when
    streamed). Where :data:`STARTER` accepts the launch, it starts the ranks instead of torchrun."""
    starter = STARTER if STARTER is not None and not stream and STARTER.accepts(argv, env) else None
    for _ in range(PORT_TRIES):
        port = free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
               f"--master-port={port}", *argv]
        if starter is not None:
            log.write_text("")
            returncode = starter.run(nproc, argv, env, log, timeout, port)
        else:
            with open(log, "w") as sink:
                returncode = run_session(cmd, env, None if stream else sink, timeout)
        text = "" if stream else log.read_text(errors="replace")
        if returncode == 0 or out.is_file() or not all(t in text for t in PORT_TAKEN):
            break
    return returncode, cmd, text


# Where ranks are started many times (the test suite), an object that starts them faster than torchrun, with what
# torchrun gives them (mcore_dapo_checks.rank_server): ``accepts(argv, env)`` and ``run(nproc, argv, env, log,
# timeout, port)``, the exit code. None: torchrun.
STARTER = None


def worker_result(run, a) -> dict:
    """``run(a)``, or the :class:`UserError` it raised (alike on every rank; also one wrapped by Ray) as
    ``{"user_error": ...}``, which :func:`torchrun` raises again in the caller: one line, not a worker's
    traceback. The error is also recorded for the launcher, in case the other ranks then fail."""
    from mcore_dapo.runtime import failures

    try:
        return run(a)
    except UserError as e:
        failures.record(e)
        return {USER_ERROR: failures.user_error_line(e)}


def worker_main(parse_args, run, argv=None) -> int:
    """A torchrun worker's ``main``: parse, run (a UserError becomes the one-line result; any other
    exception is recorded for the launcher, then raised), finish."""
    from mcore_dapo.runtime import failures

    a = parse_args(argv)
    try:
        result = worker_result(run, a)
    except BaseException as e:
        failures.record(e)
        raise
    return finish_worker(result, a.out)


def finish_worker(result: dict | None, out: str | None) -> int:
    """End of a torchrun worker: rank 0 writes ``result`` as JSON to ``out`` (stdout when None);
    then the process groups are shut down. The other half of :func:`torchrun`."""
    import torch.distributed as dist

    from mcore_dapo.runtime.parallel import shutdown

    if dist.get_rank() == 0:
        text = json.dumps(result)
        if out:
            Path(out).write_text(text)
        else:
            print(text)
    shutdown()
    return 0


def run_session(cmd: list[str], env: dict, sink, timeout: float | None, cwd=None, kill_when=None) -> int | None:
    """``cmd`` in a new session, its output to ``sink`` (a file; None: this terminal); its exit code (None
    past ``timeout``); then every process of the session killed (Ray's and torchrun's helpers too).
    ``kill_when``: a function asked every 0.1 s; once it returns True every process of the session gets
    SIGKILL at once (as a lost node or an OOM killer would stop a run), and the exit code is ``-SIGKILL``."""
    import signal
    import time

    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT if sink else None, env=env,
                            start_new_session=True, cwd=cwd)
    try:
        if kill_when is None:
            returncode = proc.wait(timeout=timeout)
        else:
            end = None if timeout is None else time.monotonic() + timeout
            returncode = None
            while proc.poll() is None and (end is None or time.monotonic() < end):
                if kill_when():
                    kill_session(proc.pid)
                    returncode = -signal.SIGKILL
                    break
                time.sleep(0.1)
            if returncode is None and proc.poll() is not None:
                returncode = proc.returncode
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        kill_session(proc.pid)
        proc.wait()
    return returncode


def _session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (Linux: /proc/<pid>/stat's session field), its leader included."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        except OSError:
            continue
        if int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def kill_session(sid: int, wait: float = 30.0) -> None:
    """SIGKILL every process of the session ``sid`` (its process group, and processes that moved to groups of
    their own, as Ray's workers do) and wait until none is left, so that nothing of a killed run still writes
    when this returns."""
    import signal
    import time

    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not os.path.isdir("/proc"):
        return
    end = time.monotonic() + wait
    while time.monotonic() < end:
        members = [pid for pid in _session_members(sid) if pid != os.getpid()]
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        # the leader stays a zombie until its parent (this process) reaps it
        if all(_is_zombie(pid) for pid in members):
            return
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
