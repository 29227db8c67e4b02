"""A lab worker as a real OS process: started, read line by line, killed with SIGKILL.

Workers announce named points on stdout (`ready`, `paused after-claim`) and
wait there; the parent reads the announcement with a deadline and then opens a
start gate or sends SIGKILL. Nothing here waits without a time limit, and a
worker left running when the parent gives up is killed, never orphaned.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from handson.infra import remote_module, warm_start


class WorkerError(RuntimeError):
    """A worker did not do what the lab expected, with its stderr attached."""


class Worker:
    """One `python -m MODULE ARGS...` process in its own process group."""

    def __init__(self, module: str, args: list[str], pass_fds: tuple[int, ...] = (),
                 env: dict | None = None):
        self.args = [sys.executable, "-m", module, *args]
        env = {**os.environ, **(env or {})}
        self.proc = _forked(module, args, pass_fds, env) or subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds, start_new_session=True, env=env)
        self.lines: list[str] = []
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_line(self, timeout_s: float) -> str:
        """The next line the worker prints, or WorkerError after the deadline."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                self.kill()
                raise WorkerError(f"no output from {self.describe()} within "
                                  f"{timeout_s} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait(timeout=timeout_s)
                raise WorkerError(f"{self.describe()} exited with "
                                  f"{self.proc.returncode}: {self.stderr()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        self.lines.append(line.decode(errors="replace"))
        return self.lines[-1]

    def expect(self, text: str, timeout_s: float = 30.0) -> None:
        line = self.read_line(timeout_s)
        if line != text:
            self.kill()
            raise WorkerError(f"expected {text!r} from {self.describe()}, got "
                              f"{line!r}; stderr: {self.stderr()}")

    def result(self, timeout_s: float = 30.0) -> dict:
        """The JSON line a worker prints last, after it has exited cleanly."""
        line = self.read_line(timeout_s)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise WorkerError(f"{self.describe()} did not exit") from None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise WorkerError(f"{self.describe()} printed {line!r}; stderr: "
                              f"{self.stderr()}") from None

    def kill(self, timeout_s: float = 10.0) -> int:
        """SIGKILL the worker's process group; return its exit status."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=timeout_s)
        return self.proc.returncode

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace").strip()[-800:]

    def describe(self) -> str:
        return f"worker {self.proc.pid} ({' '.join(self.args[2:5])} ...)"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


def _forked(module: str, args: list[str], pass_fds: tuple[int, ...], env: dict):
    """The worker forked from this process's warm-start server, with its stdout
    and stderr on pipes; None if that server cannot start it (then Popen)."""
    s = warm_start.ours("workers", popen=remote_module.Spawner.popen)
    # its queue's hosts come from our run's server of hosts, into its group
    hosts = remote_module.host_fds(env)
    try:
        p = s.start_piped(module, args, env, {1: "w", 2: "w"},
                          {**{fd: fd for fd in pass_fds}, **hosts}, pgid=0)
    finally:
        for fd in hosts.values():
            os.close(fd)
    if p is None:
        return None
    p.stdout, p.stderr = os.fdopen(p.ends[1], "rb"), os.fdopen(p.ends[2], "rb")
    return p


def run_or_kill(module: str, args: list[str], stop: str | None = None,
                timeout_s: float = 30.0) -> dict | None:
    """Run a worker to its result, or until it says `paused STOP`, then SIGKILL it.

    Returns the worker's JSON result, or None when it was killed as asked.
    """
    w = Worker(module, args)
    try:
        if stop is None:
            return w.result(timeout_s)
        w.expect(f"paused {stop}", timeout_s)
        status = w.kill()
        if status != -signal.SIGKILL:
            raise WorkerError(f"{w.describe()} ended with {status}, not SIGKILL")
        return None
    finally:
        w.close()


def open_gate(write_fd: int, n: int) -> None:
    """Release n workers blocked on the read end of a pipe, all at once."""
    os.write(write_fd, b"x" * n)


# --- the worker's side ----------------------------------------------------------

def stop_at(point_wanted: str | None, at: int | None = None,
            limit_s: float = 30.0):
    """A pause(point, n=None) that, at the wanted point (and item n), says so
    on stdout and waits there to be killed; it exits 3 if nobody does."""
    def pause(point: str, n: int | None = None) -> None:
        if point != point_wanted or (at is not None and n != at):
            return
        print(f"paused {point}" + ("" if at is None else f" {n}"), flush=True)
        time.sleep(limit_s)
        print(f"not killed within {limit_s} s at {point}", file=sys.stderr)
        os._exit(3)
    return pause


def wait_gate(fd: int, limit_s: float = 30.0) -> None:
    """Say `ready`, then block until the parent writes a byte to fd."""
    print("ready", flush=True)
    readable, _, _ = select.select([fd], [], [], limit_s)
    if not readable or not os.read(fd, 1):
        print(f"start gate not opened within {limit_s} s", file=sys.stderr)
        os._exit(4)
