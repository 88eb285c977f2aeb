"""torchrun's ranks forked from a process that has imported torch, Megatron and transformers once: the suite's
launches (:func:`mcore_dapo.runtime.launch.run_torchrun`, through its ``STARTER``) where most of a launch was each
rank importing them (docs/TESTING.md, "Launches").

A launch gets what torchrun gives its ranks: ``nproc`` fresh processes, each in a session of its own (forked by a
leader, which stands where torchrun's agent does and stops the others when one fails), torchrun's variables
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ...), the launch's environment, ``python
-m module args`` run as ``__main__`` with its output appended to the launch's log, and the normal end of an
interpreter (atexit, threads joined). Rank 0 hosts the store (``init_process_group``'s ``env://``), where torchrun's
agent would. Declined (the caller runs torchrun) where the launch's environment differs from the server's in a
variable a module may read as it imports.

The server (``python -m mcore_dapo_checks.rank_server SOCKET``) preloads :data:`PRELOAD` after the CPU adapter's
preparation, then forks on each request; it ends when its parent closes its stdin.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOAD = (
    "torch", "torch.distributed", "numpy", "safetensors.torch",
    "megatron.core", "megatron.core.parallel_state", "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.moe.moe_layer", "megatron.core.optimizer", "megatron.core.dist_checkpointing",
    "megatron.core.dist_checkpointing.strategies.torch", "megatron.core.distributed",
    "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.transformer.attention",
    "transformers", "mcore_dapo.bridge.bridge", "mcore_dapo.runtime.model", "mcore_dapo.runtime.parallel",
)
# variables that differ between launches and are read at run time only: not a reason to decline
RUN_TIME_ONLY = ("PYTEST_CURRENT_TEST", "MCORE_DAPO_FAILURES")
STOP_GRACE_S = 5.0  # a failed launch: SIGTERM to the other ranks, SIGKILL after this


# ---------------------------------------------------------------------------------------------------------------
# the server


def _preload() -> None:
    import importlib

    from mcore_dapo.devices.cpu import CpuAdapter

    CpuAdapter().prepare()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:  # a module of the other Megatron line
            pass


def _serve(path: str):
    """Accept launches until stdin closes. Each launch gets a leader, forked into a session of its own, which
    forks the ranks (:func:`_lead`); returns (request, rank) in a rank, never in the server."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    conns: dict[socket.socket, bytes] = {}
    leaders = 0
    while True:
        ready, _, _ = select.select([listener, sys.stdin, *conns], [], [], 0.2 if leaders else None)
        for r in ready:
            if r is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    return None
            elif r is listener:
                conn, _ = listener.accept()
                conns[conn] = b""
            else:
                chunk = r.recv(1 << 20)
                conns[r] += chunk
                if chunk and not conns[r].endswith(b"\n"):
                    continue
                text = conns.pop(r)
                if chunk:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    if os.fork() == 0:
                        listener.close()
                        for c in conns:
                            c.close()
                        return _lead(json.loads(text), r)
                    leaders += 1
                r.close()
        while leaders:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            leaders -= 1


def _lead(request: dict, conn: socket.socket):
    """A launch's leader, where torchrun's agent stands: it forks the ranks (each in a session of its own, as torchrun
    starts them: torch/distributed/elastic/multiprocessing/subprocess_handler, ``start_new_session``), reports their
    pids, waits; when a rank fails, stops the others' process groups as the agent does (SIGTERM, SIGKILL after
    STOP_GRACE_S) and reports torchrun's exit status (1; 0 when every rank succeeded), then exits. Returns
    (request, rank) in a rank."""
    os.setsid()
    pids = []
    for rank in range(request["nproc"]):
        pid = os.fork()
        if pid == 0:
            conn.close()
            return request, rank
        pids.append(pid)
    code = 0
    try:
        conn.sendall((json.dumps({"session": os.getpid(), "pids": pids}) + "\n").encode())
        left, stop_at = set(pids), None
        while left:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if stop_at is not None and time.monotonic() >= stop_at:
                    for other in left:
                        _signal(other, signal.SIGKILL)
                time.sleep(0.05)
                continue
            left.discard(pid)  # (the ranks are the leader's only children)
            if os.waitstatus_to_exitcode(status) != 0 and code == 0:
                code = 1  # torchrun's exit status when a rank failed; the others stopped
                for other in left:
                    _signal(other, signal.SIGTERM)
                stop_at = time.monotonic() + STOP_GRACE_S
        conn.sendall((json.dumps({"code": code}) + "\n").encode())
    finally:
        os._exit(0)


def _become_rank(request: dict, rank: int) -> None:
    """This forked process as torchrun's rank ``rank`` would start: its session, output, directory, variables,
    arguments, fresh random state."""
    import builtins
    import types

    os.setsid()
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    n = request["nproc"]
    os.environ.clear()
    os.environ.update({**request["env"], "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
                       "ROLE_RANK": str(rank), "ROLE_NAME": "default", "WORLD_SIZE": str(n),
                       "LOCAL_WORLD_SIZE": str(n), "ROLE_WORLD_SIZE": str(n), "GROUP_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(request["port"]),
                       "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                       "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                       "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    # (Python's random reseeds itself in a forked child, random.py's register_at_fork; numpy's does not)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    import torch

    torch.seed()  # as a fresh interpreter, a seed of its own
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    sys.path[0] = request["cwd"]
    sys.argv = [request["module"], *request["args"]]
    main = sys.modules["__main__"] = types.ModuleType("__main__")  # what a fresh interpreter's __main__ holds
    main.__annotations__, main.__builtins__ = {}, builtins


def main(argv=None) -> None:
    path = (argv or sys.argv[1:])[0]
    _preload()
    forked = _serve(path)
    if forked is None:
        return
    request, rank = forked
    _become_rank(request, rank)
    import runpy

    runpy._run_module_as_main(request["module"], alter_argv=True)  # what `python -m module` runs


# ---------------------------------------------------------------------------------------------------------------
# the client, one server per process that launches


class RankServer:
    """The starter :func:`mcore_dapo.runtime.launch.run_torchrun` consults: ``accepts`` a launch or not; ``run`` it,
    returning its exit code (the first failing rank's; None past the timeout)."""

    def __init__(self, extra_env: dict | None = None) -> None:
        self.extra_env = dict(extra_env or {})
        self.launches = 0
        self._proc: subprocess.Popen | None = None
        self._env: dict | None = None
        self._dir: tempfile.TemporaryDirectory | None = None

    def base_env(self) -> dict:
        """The variables of a launch from this process (:func:`mcore_dapo.runtime.launch.torchrun`'s)."""
        return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore",
                **self.extra_env}

    def accepts(self, argv: list[str], env: dict) -> bool:
        """A ``-m module`` launch whose variables are the server's (but for run-time-only ones)."""
        if len(argv) < 2 or argv[0] != "-m":
            return False
        base = self._env if self._env is not None else self.base_env()
        keys = (set(env) | set(base)) - set(RUN_TIME_ONLY)
        return all(env.get(k) == base.get(k) for k in keys)

    def _start(self) -> str:
        if self._proc is not None and self._proc.poll() is None:
            return str(Path(self._dir.name) / "socket")
        self._dir = tempfile.TemporaryDirectory(prefix="mcore-dapo-ranks-")
        path = str(Path(self._dir.name) / "socket")
        self._env = self.base_env()
        self._proc = subprocess.Popen([sys.executable, "-m", "mcore_dapo_checks.rank_server", path],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self._env,
                                      start_new_session=True)
        line = self._proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"the rank server did not start (exit code {self._proc.wait()})")
        return path

    def run(self, nproc: int, argv: list[str], env: dict, log: Path, timeout: float | None, port: int) -> int | None:
        from mcore_dapo.runtime.launch import kill_session

        path = self._start()
        self.launches += 1
        request = {"module": argv[1], "args": list(argv[2:]), "env": env, "log": str(log), "cwd": os.getcwd(),
                   "nproc": nproc, "port": port}
        end = None if timeout is None else time.monotonic() + timeout
        session, pids = None, []
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall((json.dumps(request) + "\n").encode())
            buf = b""
            try:
                while True:
                    if b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        msg = json.loads(line)
                        if "code" in msg:
                            return msg["code"]
                        session, pids = msg["session"], msg["pids"]
                        continue
                    if end is not None and time.monotonic() >= end:
                        return None
                    if select.select([s], [], [], 0.2)[0]:
                        chunk = s.recv(1 << 16)
                        if not chunk:
                            raise RuntimeError("a launch's leader ended before its ranks' exit status")
                        buf += chunk
            finally:
                for sid in [session, *pids] if session is not None else []:
                    kill_session(sid)  # what is left of the launch (a rank's helper processes)

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the process group a rank leads (its session's)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    main()
