"""A learner's module seen through a pipe: the caller never imports its code.

When EO_LEARNER_PREFIX is set (a JSON list: the argv prefix that confines a
learner process; `[]` is a plain separate process), `handson.queues.contract.load_queue`
and the other loaders return a `RemoteModule` instead of importing the file.
Each call is sent to a host process (`handson/infra/learner_host.py`) running the
learner's module, and the reply comes back as the value or as an exception of
the same type name. So the harness that calls the functions, records what they
returned and judges it, runs no learner code: what a module does on import or
in a call can change only its own replies.

A call whose first argument is a Redis client goes to a lane of its own for
that client in the host (a thread there, with its own connection to the same
server and database), so calls on several clients from several threads really
run at once, as in-process calls would; they share the module's process, as
threads do. Hosts share the caller's process group (a SIGKILL or SIGSTOP of the
group reaches both) and die with the thread that started them, which is a
thread that lives as long as the process.

A caller-side object the learner must use but never touch (a mail provider
whose store it cannot write, the pause callback that announces a kill point)
crosses as a `Caller`: the host gets a proxy, and each call of one of its
listed methods comes back over the same pipe, in the middle of the learner's
call, to be performed here, on the thread that made the call. Nothing else of
the caller's can be reached that way.

Unset (the lab on a learner's machine), nothing changes: the module is imported.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import inspect
import json
import os
import queue
import random
import socket
import subprocess
import sys
import threading
from pathlib import Path

from handson.infra import learner_host, learner_module, warm_start
from handson.infra.learner_module import SKEW_ENV, ModuleProblem
from handson.redis_server import learner_url

ENV = "EO_LEARNER_PREFIX"
HOST = str(Path(learner_host.__file__).resolve())
# What a host started afresh (not forked from the warm server) must read.
HOST_FILES = (HOST, str(Path(learner_module.__file__).resolve()))
ROOT = str(Path(learner_host.__file__).resolve().parents[2])
CALL_TIMEOUT_ENV = "EO_CALL_TIMEOUT_S"      # seconds a call may take (120)
START_TIMEOUT_S = 60.0


class Local:
    """A caller-side object the host rebuilds on its side (see learner_host).

    Local("module") is the learner's module itself; Local("work", caller=c) a
    work(stop) function and Local("queue_double", caller=c) a queue whose
    extend the caller answers, both asking the `Caller` c here for each step,
    so what the judge counts of them is counted here.
    """

    def __init__(self, kind: str, **params):
        self.spec = {"kind": kind, **params}


class Caller:
    """A caller-side object whose listed methods the host may call back.

    `methods`: the only names it may call ("__call__" for a function);
    `attrs`: plain values the host sees as attributes (e.g. `takes_reference`).
    A method the object lacks is left out, so `hasattr` reads the same there.
    """

    def __init__(self, obj, methods: tuple[str, ...] = ("__call__",),
                 attrs: tuple[str, ...] = (), name: str | None = None):
        self.obj = obj
        self.methods = tuple(m for m in methods if m == "__call__" and callable(obj)
                             or m != "__call__" and callable(getattr(obj, m, None)))
        self.attrs = {a: getattr(obj, a) for a in attrs if hasattr(obj, a)}
        self.name = name or type(obj).__name__

    def serve(self, method: str, args, kwargs):
        if method not in self.methods:
            raise PermissionError(f"{method} is not offered to the learner's code")
        fn = self.obj if method == "__call__" else getattr(self.obj, method)
        return fn(*args, **kwargs)


class LearnerError(Exception):
    """The learner's function raised; the class name is the learner's."""


class LearnerProcessDied(Exception):
    """The learner's process ended (or stopped answering) during a call."""


_KINDS: dict[str, type] = {}


def _kind(name: str) -> type:
    """An exception class called `name`, so `type(err).__name__` reads the same.

    A built-in Exception's name also gets that class as a base, so `except
    NotImplementedError` still catches it (never SystemExit and the like: the
    harness must not exit because the learner's code did).
    """
    if name not in _KINDS:
        builtin = getattr(builtins, name, None)
        bases: tuple = (LearnerError,)
        if (isinstance(builtin, type) and issubclass(builtin, Exception)
                and builtin is not Exception):
            bases = (builtin, LearnerError)
        try:
            _KINDS[name] = type(name, bases, {})
        except TypeError:
            _KINDS[name] = type(name, (LearnerError,), {})
    return _KINDS[name]


class Spawner:
    """One long-lived thread per process starts the hosts (PDEATHSIG follows it)."""

    pool: concurrent.futures.ThreadPoolExecutor | None = None
    pid = 0

    @classmethod
    def popen(cls, *args, **kwargs) -> subprocess.Popen:
        if cls.pid != os.getpid():          # none yet, or a forked child
            cls.pool = concurrent.futures.ThreadPoolExecutor(1, "learner-host")
            cls.pid = os.getpid()
        return cls.pool.submit(subprocess.Popen, *args, **kwargs).result()


CONFINE = "autograder.isolation.confine"
# What a confined host's launcher and the host itself import: trusted modules,
# imported once by the run's warm-start server of hosts (the launcher, confine,
# runs as __main__ from the code that server compiled: 2 ms of CPU less a host).
HOST_PRELOAD = ("autograder.isolation.confine", "handson.infra.warm_start",
                "handson.infra.learner_host", "tempfile", "shutil", "urllib.parse")
# A host that may reach PostgreSQL imports its driver: once for the run too
# (90 ms of CPU a host, and a pg grade starts a few dozen).
PG_PRELOAD = ("psycopg",)
# Where a launcher adds its cgroup's CPU (autograder.isolation.confine's
# COST_LOG, set by `python -m autograder bench` only): a path, nothing more.
COST_LOG = "EO_COST_LOG"
SERVER_ENV = "EO_HOST_SERVER"       # {"fd", "workdir"}: a connection passed to us
HOSTS_FD = 63                       # where a started process gets that connection
_HOSTS: dict[str, tuple[int, warm_start.Starter]] = {}   # work dir -> (pid, it)
_HOSTS_LOCK = [threading.Lock()]
os.register_at_fork(after_in_child=lambda: _HOSTS_LOCK.__setitem__(
    0, threading.Lock()))


def _start_host(prefix: list[str], cmd: list[str], env: dict, cwd: str | None,
                warm: bool = True):
    """The host process: a fork of the run's warm-start server of hosts, whose
    launcher runs the host script in the confined process (the 0.4 s of CPU a
    fresh interpreter spent importing redis-py is spent once per run); or
    Popen, for a prefix that is not the sandbox's or a server that cannot, or
    when not `warm` (a fork shares the server's hash seed and random state)."""
    workdir = confined_workdir(prefix) if warm else None
    if workdir is not None:
        proc = _forked_host(workdir, prefix, cmd, env, cwd)
        if proc is not None:
            return proc
    return Spawner.popen([*prefix, *cmd], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
                         cwd=cwd)


def confined_workdir(prefix: list[str]) -> str | None:
    """The work dir of a sandbox prefix (the run's), None for another prefix."""
    if prefix[1:3] != ["-m", CONFINE] or prefix[-1:] != ["--"]:
        return None
    try:
        return prefix[prefix.index("--workdir") + 1]
    except (ValueError, IndexError):
        return None


def _launcher_env(prefix: list[str], env: dict) -> dict:
    """Only what the launcher reads of its environment: a confined host's
    memory is a copy of the server's, so nothing else of ours goes there."""
    keep = {"PATH", "LANG", COST_LOG} | {
        b for a, b in zip(prefix, prefix[1:], strict=False) if a == "--pass"}
    return {k: v for k, v in env.items() if k in keep}


def _host_server(workdir: str, prefix: list[str], env: dict) -> warm_start.Starter:
    """This process's connection to the run's server of hosts: one we started,
    a new one over our parent's (we are its fork), the one passed to us, or a
    server of our own."""
    with _HOSTS_LOCK[0]:
        pid, s = _HOSTS.get(workdir, (0, None))
        if s is not None and pid == os.getpid() and not s.gone:
            return s
        fd = s.client_fd() if s is not None and pid != os.getpid() else None
        if fd is None and s is None:
            fd = _passed_fd(workdir)
        if fd is not None:
            s = warm_start.Starter.attach(fd)
        else:
            for key, (owner, old) in list(_HOSTS.items()):
                if owner == os.getpid() and not old.live:    # a run that is over
                    old.close()
                    del _HOSTS[key]
            s = warm_start.Starter(workdir, popen=Spawner.popen,
                                   env=_launcher_env(prefix, env),
                                   preload=host_preload(prefix))
        _HOSTS[workdir] = (os.getpid(), s)
        return s


def host_preload(prefix: list[str]) -> tuple[str, ...]:
    """What the run's server of hosts imports before its first fork."""
    return HOST_PRELOAD + (PG_PRELOAD if "--pg-url" in prefix else ())


def _passed_fd(workdir: str) -> int | None:
    """The connection `host_fds` passed us, once, if it is for this run."""
    raw = os.environ.pop(SERVER_ENV, None)
    try:
        passed = json.loads(raw or "{}")
        fd = int(passed["fd"])
        sock = socket.socket(fileno=os.dup(fd))
    except (ValueError, KeyError, TypeError, OSError):
        return None
    with sock:
        ok = sock.family == socket.AF_UNIX and sock.type == socket.SOCK_SEQPACKET
        if not ok or passed.get("workdir") != workdir:
            return None
    return fd


def host_fds(env: dict) -> dict[int, int]:
    """For a process we start with env `env` (whose learner prefix confines
    hosts): {HOSTS_FD: a new connection to our run's server of hosts} to pass
    it, and env then says where; {} if none. Close ours once it has started,
    and start it in our session (its hosts join its process group)."""
    try:
        prefix = json.loads(env.get(ENV) or "null")
    except ValueError:
        return {}
    workdir = confined_workdir(prefix) if isinstance(prefix, list) else None
    if workdir is None:
        return {}
    ours = _host_server(workdir, prefix, env).client_fd()
    if ours is None:
        return {}
    env[SERVER_ENV] = json.dumps({"fd": HOSTS_FD, "workdir": workdir})
    return {HOSTS_FD: ours}


def share_hosts() -> None:
    """Start the run's server of hosts now (EO_LEARNER_PREFIX confines them),
    so that every process forked from this one later shares it."""
    prefix = prefix_from_env()
    workdir = confined_workdir(prefix) if prefix else None
    if workdir is not None:
        _host_server(workdir, prefix, dict(os.environ))


def _forked_host(workdir: str, prefix: list[str], cmd: list[str], env: dict,
                 cwd: str | None):
    server = _host_server(workdir, prefix, env)
    # As root the server makes the host's PID namespace, and the launcher's fork
    # is its init: no launcher waits outside (4.5 ms of CPU less a host, of 22).
    proc = server.start_piped(CONFINE, [*prefix[3:-1], "--no-exec", "--init", "--",
                                        *cmd],
                              _launcher_env(prefix, env), {0: "r", 1: "w"},
                              {2: 2}, cwd=cwd, pgid=os.getpgrp(),
                              pid_namespace=os.geteuid() == 0)
    if proc is None:
        return None
    proc.stdin = os.fdopen(proc.ends[0], "w", buffering=1)
    proc.stdout = os.fdopen(proc.ends[1], "r")
    return proc


def os_threads(pid: int) -> int:
    """The threads of process `pid` (0 if it is gone), from the kernel's list:
    threading.enumerate() misses a thread made with _thread.start_new_thread."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def prefix_from_env() -> list[str] | None:
    raw = os.environ.get(ENV)
    if raw is None:
        return None
    prefix = json.loads(raw)
    if not isinstance(prefix, list) or not all(isinstance(x, str) for x in prefix):
        raise ValueError(f"{ENV} must be a JSON list of strings, got {raw!r}")
    return prefix


def redis_target(r) -> dict | None:
    """{"url", "decode"} for a redis client; None for anything else."""
    pool = getattr(r, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", None)
    if kw is None:
        return None
    auth = ""
    if kw.get("password"):
        auth = f"{kw.get('username') or ''}:{kw['password']}@"
    db = kw.get("db", 0) or 0
    if kw.get("path"):
        url = f"unix://{auth}{kw['path']}?db={db}"
    else:
        url = f"redis://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{db}"
    return {"url": learner_url(url), "decode": bool(kw.get("decode_responses"))}


class _Host:
    """One learner process, the pipe to it, and the calls waiting for replies."""

    def __init__(self, spec: str, prefix: list[str], what: str,
                 cwd: str | None = None, cold: bool = False):
        self.spec, self.what = spec, what
        env = {k: v for k, v in os.environ.items() if k not in (ENV, SKEW_ENV)}
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = ROOT + (os.pathsep + path if path else "")
        if cold:        # a new interpreter, with a hash seed of its own
            seed = f"PYTHONHASHSEED={random.SystemRandom().randrange(1, 1 << 32)}"
            env.update([seed.split("=")])
            if prefix[-1:] == ["--"] and confined_workdir(prefix) is not None:
                prefix = [*prefix[:-1], "--env", seed, "--"]
        self.proc = _start_host(prefix, [sys.executable, HOST, spec], env, cwd,
                                warm=not cold)
        self.write_lock = threading.Lock()
        try:                # the host's settings, read before the module loads
            self._send({"host": {"parent": os.getpid(), "direct": not prefix,
                                 "skew": os.environ.get(SKEW_ENV, "").strip()}})
        except (BrokenPipeError, ValueError, OSError):
            pass            # it died already: the hello says how
        self.pending: dict[int, queue.SimpleQueue] = {}   # id -> its messages
        self.replies: dict[str, int] = {}   # function -> Redis replies, last call
        self.trips: dict[str, int] = {}     # function -> round trips, last call
        self.trails: dict[str, list] = {}   # function -> its round trips, named
        self.ids = iter(range(1, 1 << 62))
        self.lanes: set = set()             # each has a thread in the host
        self.late = 0       # callbacks that came after their call had returned
        self.died: str | None = None
        self.hello: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._reader, daemon=True).start()
        hello = self._hello()
        if "load_error" in hello:
            self.close()
            raise ModuleProblem(hello["load_error"])
        self.functions: dict = hello.get("ready", {}) or {}

    def _hello(self) -> dict:
        """The host's first word; what the learner's import wrote into the pipe
        before it (anything but a hello) was skipped by the reader."""
        try:
            hello = self.hello.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self.close()
            raise ModuleProblem(f"importing {self.spec} did not finish in "
                                f"{START_TIMEOUT_S:g} s (an endless loop at "
                                "import?)") from None
        if hello is None:
            raise ModuleProblem(f"importing {self.spec} ended the process "
                                f"(exit code {self.proc.wait()})")
        return hello

    def _reader(self) -> None:
        greeted = False
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            if not greeted:
                if "ready" in msg or "load_error" in msg:
                    self.hello.put(msg)
                    greeted = True
                continue
            try:
                inbox = (self.pending.get if "callback" in msg
                         else self.pending.pop)(msg["id"])
            except (KeyError, TypeError):
                inbox = None
            if inbox is not None:
                inbox.put(msg)
            elif isinstance(msg.get("callback"), dict):   # no call of ours waits
                self.late += 1
                self._answer(msg["callback"].get("cb"),
                             error=("EOFError", "the call is over"))
        self.died = f"exited with code {self.proc.wait()}"
        if not greeted:
            self.hello.put(None)
        for inbox in list(self.pending.values()):
            inbox.put(None)

    def _send(self, msg: dict) -> None:
        with self.write_lock:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()

    def _answer(self, cb, value=None, error: tuple | None = None) -> None:
        msg = {"callback_reply": cb}
        if error:
            msg["error"] = {"type": error[0], "message": error[1]}
        else:
            msg["ok"] = learner_host.encode(value)
        try:
            self._send(msg)
        except (BrokenPipeError, ValueError, OSError):
            pass

    def _callback(self, req: dict, callers: dict) -> None:
        """Serve one callback, here on the calling thread; only our own objects."""
        if not isinstance(req, dict):
            return None
        cb = req.get("cb")
        caller = callers.get(req.get("ref"))
        if caller is None:
            return self._answer(cb, error=("PermissionError", "no such object"))
        try:
            value = caller.serve(str(req.get("method")),
                                 learner_host.decode(req.get("args") or []),
                                 learner_host.decode(req.get("kwargs") or {}))
        except Exception as err:    # the caller's own error, told to the learner
            return self._answer(cb, error=(type(err).__name__, str(err)))
        self._answer(cb, value)

    def call(self, lane, fn: str, args, kwargs, target, timeout: float,
             notes: list, crash_after: int | None = None,
             callers: dict | None = None, pause_after: int | str | None = None,
             crash_between: int | None = None, pause_ids: str | None = None):
        ident = next(self.ids)
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending[ident] = inbox
        self.lanes.add(lane)
        req = {"id": ident, "lane": lane, "fn": fn,
               "args": learner_host.encode(list(args)),
               "kwargs": learner_host.encode(dict(kwargs)), "redis": target}
        if crash_after:
            req["crash_after_reply"] = crash_after
        if pause_after:
            req["pause_after_reply"] = pause_after
        if crash_between:
            req["crash_between_reply"] = crash_between
        if pause_ids:
            req["pause_between_ids"] = pause_ids
        try:
            self._send(req)
        except (BrokenPipeError, ValueError, OSError):
            self.pending.pop(ident, None)
            raise LearnerProcessDied(f"{self.what}'s process exited with code "
                                     f"{self.proc.wait()} during {fn}()") from None
        reply = None
        while self.died is None or not inbox.empty():
            try:
                msg = inbox.get(timeout=timeout)
            except queue.Empty:
                break
            if msg is None:
                break
            if "callback" in msg:
                self._callback(msg["callback"], callers or {})
                continue
            reply = msg
            break
        if reply is None:
            self.pending.pop(ident, None)
            if self.died is None:
                self.close()
                raise LearnerProcessDied(
                    f"no answer from {self.what}'s process after {timeout:g} s "
                    f"during {fn}(); it was stopped")
            raise LearnerProcessDied(f"{self.what}'s process {self.died} during "
                                     f"{fn}()")
        notes.extend(reply.get("notes") or [])
        if isinstance(reply.get("replies"), int):
            self.replies[fn] = reply["replies"]
        if isinstance(reply.get("trips"), int):
            self.trips[fn] = reply["trips"]
        trail = reply.get("trail")
        self.trails[fn] = ([str(t) for t in trail] if isinstance(trail, list)
                           else [])
        if "error" in reply:
            err = reply["error"]
            raise _kind(err.get("type", "Exception"))(err.get("message", ""))
        return learner_host.decode(reply.get("ok"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tasks(self) -> int:
        """Threads of the host and of every process under it, as the kernel
        counts them: nothing the learner's code does in there can hide one."""
        import psutil

        try:
            top = psutil.Process(self.proc.pid)
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        return sum(os_threads(p.pid) for p in procs)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def stop(module) -> None:
    """End the host of a module `load` gave (nothing for an imported one)."""
    if isinstance(module, RemoteModule):
        module._host.close()


class RemoteModule:
    """The learner's module as attributes that call over the pipe."""

    def __init__(self, spec: str, prefix: list[str], what: str = "the queue",
                 cwd: str | None = None):
        self.__name__ = spec
        self._spec, self._prefix, self._what, self._cwd = spec, prefix, what, cwd
        self._lock = threading.Lock()
        self._keep: dict = {}           # keeps keyed clients alive: ids stay unique
        self._notes = threading.local()
        self._armed = threading.local()
        self._host = _Host(spec, prefix, what, cwd)
        self._pid = os.getpid()
        for name, n in self._host.functions.items():
            if n is not None and not hasattr(RemoteModule, name):
                setattr(self, name, self._function(name, n))

    def _function(self, name: str, n: int):
        def call(*args, **kwargs):
            return self._call(name, args, kwargs)
        call.__name__ = call.__qualname__ = name
        if n >= 0:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            call.__signature__ = inspect.Signature(
                [inspect.Parameter(f"arg{i}", kind) for i in range(n)])
        return call

    def _current(self) -> _Host:
        """The host; a new one in a forked child (the pipe is the parent's) or
        after the last one died or was stopped (a fresh process, as on a rerun)."""
        with self._lock:
            if self._pid != os.getpid() or not self._host.alive():
                self._host = _Host(self._spec, self._prefix, self._what, self._cwd)
                self._pid = os.getpid()
            return self._host

    def restart(self, cold: bool = False) -> None:
        """A new host now, its load under the start limit (ModuleProblem if
        it cannot load: the old host then stays); `cold`: a new interpreter
        with its own hash seed and random state, as another machine's worker."""
        host = _Host(self._spec, self._prefix, self._what, self._cwd, cold)
        with self._lock:
            old, ours = self._host, self._pid == os.getpid()
            self._host, self._pid = host, os.getpid()
        if ours:                # a forked child's old host is its parent's
            old.close()

    def kill(self) -> None:
        """SIGKILL the host now, wherever its call is, as a worker dies: that
        call raises LearnerProcessDied, and the next one starts a new host."""
        with self._lock:
            host = self._host
        host.close()

    def _call(self, fn: str, args: tuple, kwargs: dict,
              timeout: float | None = None):
        if timeout is None:     # read now: a fork of a server has its own
            timeout = float(os.environ.get(CALL_TIMEOUT_ENV) or 120)
        target = redis_target(args[0]) if args else None
        lane = None
        if target is not None:
            lane = id(args[0])
            self._keep.setdefault(lane, args[0])
            args = args[1:]
        callers: dict = {}
        args = [self._local(a, callers) for a in args]
        kwargs = {k: self._local(v, callers) for k, v in kwargs.items()}
        self._notes.value = []
        crash_after, self._armed.k = getattr(self._armed, "k", None), None
        between, self._armed.between = getattr(self._armed, "between", None), None
        pause, self._armed.pause = getattr(self._armed, "pause", None), None
        ids, self._armed.ids = getattr(self._armed, "ids", None), None
        if pause or ids:
            callers[0] = Caller((pause or ids)[1], name="pause")
        return self._current().call(lane, fn, args, kwargs, target, timeout,
                                    self._notes.value, crash_after, callers,
                                    pause[0] if pause else None, between,
                                    ids[0] if ids else None)

    def arm_crash(self, after_replies: int) -> None:
        """The next call on this thread: the host dies after that many replies."""
        self._armed.k = after_replies

    def arm_crash_between(self, after_replies: int) -> None:
        """The next call on this thread: the host dies when, past that many
        replies, the call sends another request (between two round trips)."""
        self._armed.between = after_replies

    def arm_pause(self, after_replies: int | str, meanwhile) -> None:
        """The next call on this thread stops after that many Redis replies
        while `meanwhile(k)` runs here (a rival call), then goes on; "every":
        after each of its replies; "steps": after each of its round trips,
        Redis replies and statements of a database the host made, as the
        next one starts (k: how many went before)."""
        self._armed.pause = (after_replies, meanwhile)

    def arm_pause_between(self, pattern: str, meanwhile) -> None:
        """The next call on this thread stops once, as it sends a request after
        a reply that held strings matching `pattern`, while `meanwhile(k, ids)`
        runs here (k: its replies so far, ids: those strings)."""
        self._armed.ids = (pattern, meanwhile)

    def replies(self, fn: str) -> int:
        """Redis replies fn's last answered call read (1 until one is known)."""
        return max(1, self._current().replies.get(fn, 1))

    def trips(self, fn: str) -> int:
        """Round trips (Redis replies and SQL statements) fn's last answered
        call made once its host counted them; 0 until then."""
        return self._current().trips.get(fn, 0)

    def trail(self, fn: str) -> list[str]:
        """fn's last answered call's round trips, in order, as the host named
        them ("SQL UPDATE ...", "Redis EVALSHA"): what the learner's
        code said it did, for a witness, never for a verdict."""
        return list(self._current().trails.get(fn, []))

    def _local(self, value, callers: dict):
        if value is self:
            value = Local("module")
        if isinstance(value, Caller):
            ref = len(callers) + 1
            callers[ref] = value
            value = Local("caller", ref=ref, name=value.name,
                          methods=list(value.methods),
                          attrs=learner_host.encode(value.attrs))
        if isinstance(value, Local):
            spec = {k: self._local(v, callers) if isinstance(v, Caller) else v
                    for k, v in value.spec.items()}
            if spec.get("kind") == "redis":     # the learner's user, never ours
                spec["url"] = learner_url(spec["url"])
            return {"__local__": spec}
        return value

    def notes(self) -> list[dict]:
        """What the stand-ins of this thread's last call saw."""
        return list(getattr(self._notes, "value", []))

    def threads(self) -> int:
        """Threads running in the learner's processes now, counted from outside,
        less one per lane (the host's thread for each caller-side client):
        compare two counts, since the prefix's own processes count too."""
        host = self._current()
        return host.tasks() - len(host.lanes)

    def late_callbacks(self) -> int:
        """Calls back from the learner's threads after their call had returned
        (refused): e.g. a heartbeat still beating once run_with_heartbeat is
        over."""
        return self._current().late

    def close(self) -> None:
        if self._pid == os.getpid():
            self._host.close()


def load(spec: str, prefix: list[str], what: str = "the queue",
         cwd: str | None = None) -> RemoteModule:
    """The module at `spec` in a host process; ModuleProblem if it cannot load."""
    return RemoteModule(spec, prefix, what, cwd)


def load_learner(spec: str, required: tuple[str, ...] = (),
                 what: str = "your module"):
    """A lab worker's loader: imported on a learner's machine (no prefix), else
    hosted in a process of its own (a `RemoteModule`); ModuleProblem either way."""
    prefix = prefix_from_env()
    if prefix is None:
        return learner_module.load(spec, required)
    module = load(spec, prefix, what)
    lacking = [f for f in required if not hasattr(module, f)]
    if lacking:
        module.close()
        raise ModuleProblem(f"{spec} defines no {', '.join(lacking)}")
    return module
