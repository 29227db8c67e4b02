"""Run untrusted code in a child process tree that is always cleaned up.

The grader never imports a learner's code. Every step that touches it (the
notebook's kernel, the contract checks, the chaos run, the heartbeat trial)
runs as a command under a small supervisor (`python -m autograder.sandbox`):

- the supervisor is a *child subreaper*, so a process the learner forks and
  orphans (a kernel starts in its own session; a double fork escapes any
  process group) is re-parented to the supervisor instead of init, and can be
  found and killed;
- the command gets its own session, a wall-clock limit and an address-space
  limit (`resource.setrlimit` in the child before exec);
- when the command ends, or runs out of time, every descendant still alive is
  listed (that is "left processes behind"), killed with SIGKILL and reaped.

The grader side (`run`) puts its own limit on the supervisor too, and kills the
whole tree if even the supervisor does not come back.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
DEFAULT_MEM_MB = 3072


@dataclass
class Finished:
    """What happened to one sandboxed command."""

    cmd: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float
    leftovers: list[str] = field(default_factory=list)   # "pid: cmdline" killed

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, n: int = 1200) -> str:
        """The end of stderr (or stdout), for a message the learner can read."""
        text = (self.stderr.strip() or self.stdout.strip())
        return text[-n:]


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(option, value, 0, 0, 0)


def _limit_child(mem_mb: int):
    def preexec() -> None:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        limit = mem_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return preexec


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid}: {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return f"{proc.pid}: (gone)"


def kill_tree(root: psutil.Process | None = None, *, include_root: bool = False,
              rounds: int = 20) -> list[str]:
    """SIGKILL every descendant (repeatedly: some fork while we kill); reap them."""
    root = root or psutil.Process()
    seen: list[str] = []
    for _ in range(rounds):
        try:
            procs = root.children(recursive=True)
        except psutil.Error:
            procs = []
        if include_root:
            procs.append(root)
        alive = [p for p in procs if p.is_running()
                 and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        for p in alive:
            seen.append(_describe(p))
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGSTOP)     # freeze first: no more forking
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=2)
        _reap_zombies()
        if include_root:
            break
    _reap_zombies()
    return seen


def _reap_zombies() -> None:
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break


def supervise(cmd: list[str], timeout: float, mem_mb: int, cwd: str | None,
              status_path: str) -> int:
    """The supervisor's body: run cmd with limits, then clean up everything."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    start = time.monotonic()
    timed_out = False
    child = subprocess.Popen(cmd, cwd=cwd, preexec_fn=_limit_child(mem_mb))
    try:
        rc = child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.kill()
        rc = child.wait()
    leftovers = kill_tree()
    status = {"returncode": rc, "timed_out": timed_out,
              "elapsed_s": round(time.monotonic() - start, 3), "leftovers": leftovers}
    Path(status_path).write_text(json.dumps(status))
    return 0


def run(cmd: list[str], timeout: float, *, cwd: str | os.PathLike | None = None,
        env: dict | None = None, mem_mb: int = DEFAULT_MEM_MB) -> Finished:
    """Run cmd under a supervisor with a time and memory limit; never hangs."""
    with tempfile.TemporaryDirectory(prefix="eo-sandbox-") as tmp:
        status_path = os.path.join(tmp, "status.json")
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        sup = [sys.executable, "-m", "autograder.sandbox", "--timeout", str(timeout),
               "--mem-mb", str(mem_mb), "--status", status_path]
        if cwd is not None:
            sup += ["--cwd", str(cwd)]
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(sup + ["--", *cmd], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
            try:
                proc.wait(timeout=timeout + 30)
            except subprocess.TimeoutExpired:
                kill_tree(psutil.Process(proc.pid), include_root=False)
                proc.kill()
                proc.wait()
        stdout = Path(out_path).read_text(errors="replace")
        stderr = Path(err_path).read_text(errors="replace")
        try:
            status = json.loads(Path(status_path).read_text())
        except (OSError, ValueError):
            status = {"returncode": None, "timed_out": True, "leftovers": [],
                      "elapsed_s": time.monotonic() - start}
    return Finished(cmd=list(cmd), returncode=status["returncode"], stdout=stdout,
                    stderr=stderr, timed_out=status["timed_out"],
                    elapsed_s=status["elapsed_s"], leftovers=status["leftovers"])


def learner_prefix(workdir: str | os.PathLike, redis_url: str | None = None,
                   read_paths: tuple[str, ...] = ()) -> list[str]:
    """The argv prefix that runs one learner process confined to a grading run.

    `prefix + [sys.executable, script, ...]` starts a process that may write
    only under `workdir`, read the interpreter, its libraries and `read_paths`,
    reach only the Redis at `redis_url`, and shares the run's memory, process
    and disk budget. Trusted harness processes (which never import learner
    code) use it to start the learner's side of a call. An empty prefix means
    no confinement beyond a separate process.
    """
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run a command with limits; clean up.")
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--mem-mb", type=int, default=DEFAULT_MEM_MB)
    p.add_argument("--cwd")
    p.add_argument("--status", required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return supervise(cmd, args.timeout, args.mem_mb, args.cwd, args.status)


if __name__ == "__main__":
    sys.exit(main())
