"""Run untrusted code in a child process tree that is always cleaned up.

The grader never imports a learner's code. Every step that touches it (the
notebook's kernel, the contract checks, the chaos run, the heartbeat trial)
runs as a command under a small supervisor (`python -m autograder.isolation.sandbox`):

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
import ast
import contextlib
import ctypes
import functools
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from autograder.isolation import confine
from autograder.isolation.cgroup import Cgroup, account

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
DEFAULT_MEM_MB = 3072          # per process (address space), as a last resort
TREE_MEM_MB = 2048             # one memory cap for all learner processes of a run
TREE_PIDS = 512                # one cap on their processes and threads
DISK_MB = 512                  # the run's work dir may not grow past this
# The CPUs a run's confined processes share (its harnesses run there too): the
# machine's. The cgroup's weight (four processes', however many it forks) keeps
# a learner's spinners from starving the judge, and its count of CPU used
# denies them an excuse; a tighter cap throttled correct queues' harnesses
# into timeouts on an idle machine.
TREE_CPUS = float(os.cpu_count() or 2)


@dataclass
class Finished:
    """What happened to one sandboxed command, and which protections held."""

    cmd: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float
    leftovers: list[str] = field(default_factory=list)   # "pid: cmdline" killed
    isolation: str = "none"            # "full", "partial: no ...", "none"
    protections: dict = field(default_factory=dict)
    supervisor_killed: str = ""        # how the supervisor died, if it did
    disk_exceeded: bool = False
    oom_kills: int = 0

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and not self.timed_out
                and not self.supervisor_killed and not self.disk_exceeded)

    def tail(self, n: int = 1200) -> str:
        """The end of stderr (or stdout), for a message the learner can read."""
        text = (self.stderr.strip() or self.stdout.strip())
        return text[-n:]

    def problems(self) -> list[str]:
        """What went wrong that the command itself cannot report, one line each."""
        out = []
        if self.supervisor_killed:
            out.append(f"the sandbox supervisor was killed ({self.supervisor_killed}); "
                       "everything it ran was killed with it")
        if self.disk_exceeded:
            out.append("the work dir grew past the disk quota; everything was killed")
        if self.oom_kills:
            out.append(f"the memory cap of the whole process tree was hit "
                       f"({self.oom_kills} process(es) killed)")
        return out


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


class _Forked:
    """A forked child seen as Popen sees one: `pid`, `wait(timeout)`, `kill()`."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None
        self.args = [str(pid)]
        self._fd = os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self._fd)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _start(cmd: list[str], cwd: str | None, mem_mb: int):
    """The command's process. The sandbox's own launcher is a fork of this
    process, which has imported it already (a fresh interpreter spent 40 ms of
    CPU a run on that); anything else is exec'd."""
    if not (cmd[1:3] == ["-m", confine.__name__] and hasattr(os, "pidfd_open")
            and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)):
        return subprocess.Popen(cmd, cwd=cwd, preexec_fn=_limit_child(mem_mb))
    pid = os.fork()
    if pid:
        return _Forked(pid)
    code = 1
    try:
        os.closerange(3, 1 << 16)
        if cwd is not None:
            os.chdir(cwd)
        _limit_child(mem_mb)()
        sys.argv = [confine.__file__, *cmd[3:]]
        code = confine.main(cmd[3:])
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException:      # noqa: BLE001 - said on stderr, as a crash would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def supervise(cmd: list[str], timeout: float, mem_mb: int, cwd: str | None,
              status_path: str) -> int:
    """The supervisor's body: run cmd with limits, then clean up everything."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    start = time.monotonic()
    timed_out = False
    child = _start(cmd, cwd, mem_mb)
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
        env: dict | None = None, mem_mb: int = DEFAULT_MEM_MB, confined: bool = False,
        read_paths: tuple[str, ...] = (), redis_url: str | None = None,
        learner_env: dict | None = None, tree_mem_mb: int | None = None,
        disk_mb: int | None = None, pg_url: str | None = None,
        on_line: Callable[[str], None] | None = None,
        stop: threading.Event | None = None) -> Finished:
    """Run cmd under a supervisor with a time and memory limit; never hangs.

    `confined=True` runs it as learner code: in the sandbox of
    `autograder.isolation.confine` with `cwd` as its work dir (required),
    `read_paths` readable, only the Redis at `redis_url` (and the PostgreSQL at
    `pg_url`: give it the learner's role's URL, `autograder.isolation.pg_run`),
    and only `learner_env` besides PATH, HOME, TMPDIR and LANG.
    `on_line` hears each line of stdout as it is written (all of it is in the
    result too); `stop`, once set, ends the run as its time limit would.
    """
    with tempfile.TemporaryDirectory(prefix="eo-sandbox-") as tmp:
        status_path = os.path.join(tmp, "status.json")
        confine_path = os.path.join(tmp, "confine.json")
        out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        sup = ["--timeout", str(timeout), "--mem-mb", str(mem_mb),
               "--status", status_path]
        if cwd is not None:
            sup += ["--cwd", str(cwd)]
        if confined:
            if cwd is None:
                raise ValueError("a confined run needs its work dir as cwd")
            cmd_run = _prefix(cwd, redis_url, read_paths, learner_env or {},
                              status=confine_path, mem_mb=tree_mem_mb or TREE_MEM_MB,
                              disk_mb=disk_mb or DISK_MB, pg_url=pg_url) + list(cmd)
        else:
            cmd_run = list(cmd)
        start = time.monotonic()
        killed = ""
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = _supervisor(sup + ["--", *cmd_run], out, err, env)
            try:
                _wait(proc, timeout + 30, out_path, on_line, stop)
            except (subprocess.TimeoutExpired, _Stopped) as why:
                kill_tree(psutil.Process(proc.pid), include_root=False)
                proc.kill()
                proc.wait()
                killed = ("its caller stopped it" if isinstance(why, _Stopped)
                          else "it did not come back after the time limit")
        if proc.returncode and proc.returncode < 0 and not killed:
            killed = f"signal {-proc.returncode}"
        if confined:
            cleanup(cwd)
        stdout = Path(out_path).read_text(errors="replace")
        stderr = Path(err_path).read_text(errors="replace")
        try:
            status = json.loads(Path(status_path).read_text())
        except (OSError, ValueError):
            status = {"returncode": None, "timed_out": False, "leftovers": [],
                      "elapsed_s": round(time.monotonic() - start, 3)}
            killed = killed or "it ended without a report"
        report = _read_json(confine_path)
    leftovers = report.get("leftovers", []) + status["leftovers"]
    return Finished(cmd=list(cmd), returncode=status["returncode"], stdout=stdout,
                    stderr=stderr, timed_out=status["timed_out"],
                    elapsed_s=status["elapsed_s"], leftovers=leftovers,
                    isolation=report.get("isolation", "none"),
                    protections=report.get("protections", {}),
                    supervisor_killed=killed,
                    disk_exceeded=bool(report.get("disk_exceeded")),
                    oom_kills=int(report.get("oom_kills", 0)))


SUPERVISOR = "autograder.isolation.sandbox"
# What the server of supervisors imports: the supervisor, with all it imports.
SUPERVISOR_PRELOAD = (SUPERVISOR,)


def _supervisor(args: list[str], out, err, env: dict | None):
    """The supervisor, in a session of its own: a fork of this process's server
    of supervisors, which has imported what it imports (a fresh interpreter
    spent 55 ms of CPU a run on that), or a fresh interpreter if that server
    cannot start it."""
    from handson.infra import remote_module, warm_start

    # its forks keep its command line: the label puts the supervisor's in it
    server = warm_start.ours(f"{SUPERVISOR}-server", popen=remote_module.Spawner.popen,
                             preload=SUPERVISOR_PRELOAD, base=False)
    proc = server.start(SUPERVISOR, args, dict(os.environ if env is None else env),
                        None, {1: out.fileno(), 2: err.fileno()})
    if proc is None:
        proc = subprocess.Popen([sys.executable, "-m", SUPERVISOR, *args],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    return proc


class _Stopped(Exception):
    """The caller's `stop` was set."""


def _wait(proc: subprocess.Popen, limit: float, out_path: str,
          on_line: Callable[[str], None] | None,
          stop: threading.Event | None) -> None:
    """proc.wait(limit), handing each complete line of its stdout to `on_line`,
    and raising _Stopped once `stop` is set."""
    if on_line is None and stop is None:
        proc.wait(timeout=limit)
        return
    deadline = time.monotonic() + limit
    rest = b""
    with open(out_path, "rb") as out:
        while True:
            done = proc.poll() is not None
            *lines, rest = (rest + out.read()).split(b"\n")
            for line in lines:
                if on_line is not None:
                    on_line(line.decode(errors="replace"))
            if done:
                return
            if stop is not None and stop.is_set():
                raise _Stopped
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, limit)
            time.sleep(0.1)


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


# What a learner host's environment keeps of its harness's: the queue's bound
# (the contract says to read it there) and the course root for the host's
# stand-ins. The host's own settings come on its pipe, not in its environment.
HOST_ENV = ("QUEUE_MAX", "PYTHONPATH")


def _prefix(workdir, redis_url, read_paths, env: dict, status: str | None = None,
            mem_mb: int | None = None, disk_mb: int | None = None,
            passenv: tuple[str, ...] = (), pg_url: str | None = None) -> list[str]:
    prefix = [sys.executable, "-m", "autograder.isolation.confine",
              "--workdir", str(workdir), "--mem-mb", str(mem_mb or TREE_MEM_MB),
              "--pids", str(TREE_PIDS), "--cpus", str(TREE_CPUS),
              "--disk-mb", str(disk_mb or DISK_MB)]
    if redis_url:                   # learner code gets the learner's user only
        # Imported here: the supervisor (`main`) never needs the Redis client,
        # whose import is most of a supervisor's start (0.15 s CPU).
        from handson.redis_server import learner_url
        prefix += ["--redis-url", learner_url(redis_url)]
    if pg_url:                      # already the learner's role (pg_run)
        prefix += ["--pg-url", pg_url]
    for path in read_paths:
        prefix += ["--read", str(path)]
    for key, value in env.items():
        prefix += ["--env", f"{key}={value}"]
    for name in passenv:
        prefix += ["--pass", name]
    if passenv:             # a harness's host: stopped and killed with its group
        prefix.append("--keep-group")
    if status:
        prefix += ["--status", status]
    return prefix + ["--"]


def learner_prefix(workdir: str | os.PathLike, redis_url: str | None = None,
                   read_paths: tuple[str, ...] = (), pg_url: str | None = None
                   ) -> list[str]:
    """The argv prefix that runs one learner process confined to a grading run.

    `prefix + [sys.executable, script, ...]` starts a process that may write
    only under `workdir`, read the interpreter, its libraries and `read_paths`
    (the script itself must be among them, or in the work dir), reach only the
    Redis at `redis_url` (also in its environment as REDIS_URL), and shares the
    run's memory, process and disk budget with every other learner process of
    the run (the same work dir). `pg_url`: the PostgreSQL it may reach, as the
    learner's role (also DATABASE_URL and PGQ_URL). Call `cleanup(workdir)` when
    the run is over.
    """
    return _prefix(workdir, redis_url, tuple(read_paths), {}, passenv=HOST_ENV,
                   pg_url=pg_url)


def cleanup(workdir: str | os.PathLike) -> list[str]:
    """Kill whatever still runs in a run's cgroup and remove it; what was killed."""
    cgroup = Cgroup(confine.run_id(str(workdir)))
    killed = []
    for d in cgroup.dirs.values():
        for _ in range(20):
            try:
                pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    killed.append(_describe(proc))
                    proc.kill()
            time.sleep(0.05)
    # Its CPU goes to the cost log as its last launcher would have added it:
    # a host's launcher killed with its harness never does.
    account("learner", cgroup.remove())
    return killed


def isolation() -> Finished:
    """What a confined learner process gets on this machine (a real, tiny run)."""
    with tempfile.TemporaryDirectory(prefix="eo-probe-") as tmp:
        return run([sys.executable, "-c", "pass"], timeout=30, cwd=tmp, confined=True)


_PARSE_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one thread at a time: two at once can fail on Python 3.11
    (a SystemError about the AST constructor's recursion depth), and grades run
    side by side in threads."""
    with _PARSE_LOCK:
        return ast.parse(source, filename=filename)


def kernel_read_paths(also: str | None = None) -> tuple[str, ...]:
    """What the learner's kernel may read of the course: the notebook runner and
    the `handson` modules the released notebooks import (and what those import).

    `also`: a course module that the grader itself runs in the kernel (an
    assignment's observe cell), with what it imports. Nothing else of the
    checkout: not `solutions/`, not `tests/`, not the rest of `autograder/`.
    """
    root = Path(__file__).resolve().parents[2]      # autograder/isolation/
    wanted: set[str] = {"autograder.notebooks.run_notebook"}
    for nb in sorted((root / "exercises").glob("*/*.ipynb")):
        text = nb.read_text(errors="replace")
        wanted |= {f"handson.{m}" for m in re.findall(r"handson\.(\w+(?:\.\w+)*)",
                                                      text)}
        wanted |= {f"handson{sub}.{m}" for sub, group in
                   re.findall(r"from handson((?:\.\w+)*) import ([\w, ]+)", text)
                   for m in re.split(r"[, ]+", group) if m}
    if also:
        wanted.add(also)
    return _closure(root, wanted)


def _closure(root: Path, wanted: set[str]) -> tuple[str, ...]:
    """The files of `wanted` and of every course module they import."""
    seen: set[str] = set()
    while wanted - seen:
        name = sorted(wanted - seen)[0]
        seen.add(name)
        parts = name.split(".")         # the packages on its way are imported too
        wanted |= {".".join(parts[:i]) for i in range(2, len(parts))}
        path = _module_file(root, name)
        if path:
            wanted |= _course_imports(path, name)
    files = [root / "autograder" / "__init__.py", root / "handson" / "__init__.py"]
    files += [f for n in sorted(seen) if (f := _module_file(root, n))]
    return tuple(dict.fromkeys(str(f) for f in files if f.exists()))


def _module_file(root: Path, name: str) -> Path | None:
    """The file of a course module (`a/b.py`) or package (`a/b/__init__.py`)."""
    path = root.joinpath(*name.split("."))
    for f in (path.with_suffix(".py"), path / "__init__.py"):
        if f.is_file():
            return f
    return None


def _course_imports(path: Path, module: str) -> set[str]:
    """The course modules (`handson.x`, `handson.x.y`, `autograder.z`) a module
    imports; a name that is no file (an imported function) is dropped later.
    Read once per version of the file: a grade asks about the same few dozen
    files fifty times."""
    try:
        st = path.stat()
    except OSError:
        return set()
    return set(_parsed_imports(str(path), module, st.st_mtime_ns, st.st_size))


# An import statement (at a line's start, or after `;` or a compound statement's
# `:`), once strings and comments are blanked out (a script a module holds in a
# string is not what it imports): what the parser finds (tests/test_sandbox.py
# holds them to it), in 0.03 s of a grade's CPU where parsing the fifty files
# its sandboxes may read took 0.24.
_NOISE = re.compile(r"""(\"\"\"|'''|"|')(?:\\.|(?!\1).)*?\1|#[^\n]*""", re.S)
_IMPORT = re.compile(
    r"(?:^|[;:])[ \t]*(?:from[ \t]+(?P<mod>\.*[\w.]*)[ \t]+import[ \t]+"
    r"(?P<names>\([^)]*\)|[^\n;]*)|import[ \t]+(?P<plain>[^\n;]*))", re.M)


@functools.lru_cache(maxsize=512)
def _parsed_imports(path: str, module: str, _mtime_ns: int, _size: int
                    ) -> frozenset[str]:
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    try:
        text = _NOISE.sub(lambda m: "''" if m[1] else "",
                          Path(path).read_text(errors="replace"))
        text = text.replace("\\\n", " ")      # one logical line
    except OSError:
        return frozenset()
    names: set[str] = set()
    for m in _IMPORT.finditer(text):
        if m["plain"] is not None:
            mods = [part.split()[0] for part in m["plain"].split(",") if part.split()]
        else:
            mod = m["mod"].lstrip(".")
            if level := len(m["mod"]) - len(mod):
                base = package.rsplit(".", level - 1)[0]
                mod = f"{base}.{mod}" if mod else base
            listed = m["names"].strip("() \t\n").split(",")
            mods = [mod] + [f"{mod}.{part.split()[0]}" for part in listed
                            if part.split()]
        names |= {n for n in mods if n.split(".")[0] in ("handson", "autograder")
                  and n.count(".") >= 1}
    return frozenset(names)


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
