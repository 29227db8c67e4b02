"""Start the course's own worker processes by fork from one that imported redis.

A fresh interpreter spends about 0.3 s of CPU importing redis-py, and a chaos
run restarts its workers hundreds of times: on two cores that was most of a
graded run's CPU. So a run starts this server once (`Starter`); each worker is
a fork of it that runs its module as `python -m` would, with its own argv,
environment, session and log. What the worker does is unchanged; only the
imports it shares with every other worker are already done.

    python -m handson.infra.warm_start [LABEL]   # the server: JSON lines on stdin

(LABEL, e.g. the run's directory, only shows in `ps` whose server it is.)

Trusted code only: the server preloads the standard library and redis-py,
never a learner's module (a worker loads that after the fork, as before, or
through its sandboxed host). Each request {"module", "args", "env", "log"} is
answered {"pid": n}; each child's end {"exit": pid, "code": c}, with c as
`Popen.returncode` has it (-9 for SIGKILL). A child dies with the server, and
the server with the process that started it; closing its stdin kills what it
started.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import importlib
import json
import os
import queue
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback

from handson import redis_server

_PR_SET_NAME = 15
PRELOAD = ("redis", "sqlite3", "argparse", "hashlib", "uuid")
START_TIMEOUT_S = 30.0


# --- the server --------------------------------------------------------------------

def _exit_code(err: SystemExit) -> int:
    """What `python -m` exits with for sys.exit(code)."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


def _child(req: dict, fds: list[int], server: int) -> int:
    """Run `python -m MODULE ARGS` with req's environment, directory and files
    (req["fds"]: where each passed fd goes; 0, 1, 2 default to /dev/null and
    the log); its exit code. The caller then exits as the interpreter does."""
    try:
        os.setsid()
        redis_server.die_with_parent(server)
        _name(req["module"])
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = req.get("log") or os.devnull
        want = {0: os.open(os.devnull, os.O_RDONLY),
                1: os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)}
        want[2] = want[1]
        want.update(zip(req.get("fds", []), fds, strict=True))
        top = max(want) + 1            # copies above every target: none clobbered
        high = {t: fcntl.fcntl(fd, fcntl.F_DUPFD, top) for t, fd in want.items()}
        for target, fd in high.items():
            os.dup2(fd, target)
        for fd in range(3, top):
            if fd not in high:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.closerange(top, 1 << 16)
        os.chdir(req.get("cwd") or ".")
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [d for d in req["env"].get("PYTHONPATH", "").split(os.pathsep)
                 if d and d not in sys.path]
        sys.path[:1] = [os.getcwd(), *extra]        # as `python -m` sets it
        sys.argv = [req["module"], *req["args"]]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as err:
        return _exit_code(err)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _name(module: str) -> None:
    """Show the module as the process's name (ps -o comm, /proc/PID/comm): its
    command line stays the server's."""
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_NAME, module.encode()[:15], 0, 0, 0)


def _write(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def serve() -> int:
    for name in PRELOAD:
        importlib.import_module(name)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    inbox = socket.socket(fileno=0)           # SOCK_SEQPACKET: one request each
    open_ = True
    while open_:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        if 0 in ready:
            data, fds, _, _ = socket.recv_fds(inbox, 1 << 20, 64)
            open_ = bool(data)
            if data:
                req = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    # the interpreter's own exit: threads, atexit, buffers
                    raise SystemExit(_child(req, fds, os.getppid()))
                for fd in fds:
                    os.close(fd)
                children.add(pid)
                _write({"pid": pid, "args": [sys.executable, "-m", req["module"],
                                             *req["args"]]})
        _reap(children)
    for pid in children:         # the run is over: nothing it started outlives it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):     # not yet in its session
            os.kill(pid, signal.SIGKILL)
    while children:
        _reap(children, block=True)
    return 0


def _reap(children: set[int], block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        _write({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if block:
            return


# --- the caller's side -------------------------------------------------------------

class Starter:
    """One server for a run: `start()` gives a process handle like Popen's."""

    def __init__(self, label: str = "", popen=subprocess.Popen):
        """`popen`: what starts the server (one that starts it on a thread that
        lives as long as the process, when the caller's thread may not)."""
        self.lock = threading.Lock()
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.changed = threading.Condition()
        self.gone = False
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = popen(
                [sys.executable, "-m", "handson.infra.warm_start",
                 *([label] if label else [])], stdin=theirs.fileno(),
                stdout=subprocess.PIPE, preexec_fn=functools.partial(
                    redis_server.die_with_parent, os.getpid()))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        """Replies in the server's order: a pid's exit comes before its reuse."""
        live: dict[int, WarmProcess] = {}
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "pid" in msg:
                live[msg["pid"]] = WarmProcess(self, msg["pid"], msg["args"])
                self.replies.put(live[msg["pid"]])
                continue
            with self.changed:
                if (h := live.pop(msg["exit"], None)) is not None:
                    h.returncode = msg["code"]
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()
        self.replies.put(None)

    def start(self, module: str, args: list[str], env: dict, log: str | None,
              fds: dict[int, int] | None = None) -> WarmProcess | None:
        """A forked `python -m module args` in this directory, or None if the
        server is gone. `fds`: {fd in the child: fd of ours} (pass_fds, or a
        pipe for its stdout); the rest of 0, 1, 2 are /dev/null and `log`."""
        fds = fds or {}
        req = {"module": module, "args": args, "env": env, "log": log,
               "cwd": os.getcwd(), "fds": list(fds)}
        with self.lock:
            if self.gone:
                return None
            try:
                socket.send_fds(self.sock, [json.dumps(req).encode()],
                                list(fds.values()))
                return self.replies.get(timeout=START_TIMEOUT_S)
            except (OSError, ValueError, queue.Empty):
                return None

    def close(self) -> None:
        """Kill whatever is still running of what it started, then end it."""
        self.sock.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class WarmProcess:
    """A started worker: `pid`, `poll()`, `wait()` and `returncode` as in Popen."""

    def __init__(self, starter: Starter, pid: int, args: list[str]):
        self.starter, self.pid, self.args = starter, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        s = self.starter
        if self.returncode is None and s.gone and not _alive(self.pid):
            with s.changed:
                if self.returncode is None:
                    self.returncode = -signal.SIGKILL   # died with its server
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.starter.changed:
            if not self.starter.changed.wait_for(lambda: self.poll() is not None,
                                                 timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    sys.exit(serve())
