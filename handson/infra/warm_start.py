"""Start the course's own worker processes by fork from one that imported redis.

A fresh interpreter spends about 0.3 s of CPU importing redis-py, and a chaos
run restarts its workers hundreds of times: on two cores that was most of a
graded run's CPU. So a run starts this server once (`Starter`); each worker is
a fork of it that runs its module as `python -m` would, with its own argv,
environment, session and log. What the worker does is unchanged; only the
imports it shares with every other worker are already done.

    python -m handson.infra.warm_start [--bare] [--preload M,...] [LABEL]

(the server; LABEL, e.g. the run's directory, only shows in `ps` whose server
it is; --preload: more trusted modules to import before the first fork (one
started as `python -m` then runs from the code the server compiled, with
nothing left to import); --bare: only those, not PRELOAD.)

Trusted code only: the server preloads the standard library and redis-py,
never a learner's module (a worker loads that after the fork, as before, or
through its sandboxed host). A run's server of confined hosts
(`remote_module`) is one more such server, started with only what the
launcher reads of the environment: its forks confine themselves, then run
the host script in place (`confine --no-exec`, `run_script`), so what they
could read of its memory holds nothing a learner may not have.

Each request {"module", "args", "env", "log"} is answered {"pid": n}; a child
leaves for a session of its own unless the request names a process group
("pgid": 0 for a group of its own in the server's session, or a caller's
group, which a signal to it then reaches). With "pid_namespace" the server
makes a new PID namespace for that one child, which is its PID 1 (as root;
else as without): the server puts it in the caller's group, whose number it
cannot see, before it runs. Each child's end is answered
{"exit": pid, "code": c}, with c as `Popen.returncode` has it (-9 for SIGKILL).
Requests and replies are messages on a Unix socket (fd 0), or on another
connection passed over it (`Starter.client_fd`). A child dies with the server,
and the server with the process that started it; a closed connection kills
what was started over it, and closing fd 0 kills everything.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import gc
import importlib
import itertools
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
import time
import traceback
import types
import typing

from handson import redis_server

_PR_SET_NAME = 15
PRELOAD = ("redis", "sqlite3", "argparse", "hashlib", "uuid")
START_TIMEOUT_S = 30.0
GONE_POLL_S = 0.05      # how often a wait looks at a child whose server died
# A preloaded module's code by its file, for `run_script` of that file: a host
# compiled its 700-line script from source, 7 ms of CPU each, a hundred a grade.
_SCRIPTS: dict[str, types.CodeType] = {}
# The same by the module's name, with its spec, for `python -m` of it: a chaos
# worker imported what handson.worker imports anew in each fork (24 ms of CPU,
# half of what a worker used in a grade), a host's launcher read its module.
_MODULES: dict[str, tuple[types.CodeType, importlib.machinery.ModuleSpec]] = {}
# the interpreter's own directories (stdlib, site-packages): sys.path without
# the server's first entry and its PYTHONPATH, which each child sets anew
BASE_PATH = [p for p in sys.path[1:]
             if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]


# --- the server --------------------------------------------------------------------

def _exit_code(err: SystemExit) -> int:
    """What `python -m` exits with for sys.exit(code)."""
    if err.code is None:
        return 0
    if isinstance(err.code, int):
        return err.code
    print(err.code, file=sys.stderr)
    return 1


_CLONE_NEWPID = 0x20000000
_OWN_PID_NS: list[int] = []       # an fd of our PID namespace, once opened


def _new_pid_namespace() -> bool:
    """Our next child is the init of a new PID namespace, if we may come back
    to ours after it (root; not root in a user namespace, which may make one)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not _OWN_PID_NS:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY)
        if libc.setns(fd, _CLONE_NEWPID) != 0:
            os.close(fd)
            fd = -1
        _OWN_PID_NS.append(fd)
    return _OWN_PID_NS[0] >= 0 and libc.unshare(_CLONE_NEWPID) == 0


def _our_pid_namespace() -> None:
    """Our children are in our PID namespace again; if they could not be, we
    stop: a later child must never land in an earlier one's namespace."""
    if ctypes.CDLL(None, use_errno=True).setns(_OWN_PID_NS[0], _CLONE_NEWPID):
        os._exit(70)


def _child(req: dict, fds: list[int], server: int, ready: int,
           in_new_namespace: bool = False) -> int:
    """Run `python -m MODULE ARGS` with req's environment, directory and files
    (req["fds"]: where each passed fd goes; 0, 1, 2 default to /dev/null and
    the log); its exit code. The caller then `leave`s with it.
    `ready` hears once the child is in its session or group, or why not."""
    try:
        if req.get("pgid") is None:
            os.setsid()
        elif in_new_namespace and req["pgid"]:
            pass                            # the server put us in it
        else:                               # 0: a group of its own
            os.setpgid(0, req["pgid"])
    except OSError as err:
        os.write(ready, f"cannot join process group {req['pgid']}: {err}".encode())
        os._exit(1)
    os.write(ready, b"ok")
    os.close(ready)
    try:
        redis_server.die_with_parent(server)
        _name(req["module"])
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
        _environ(req["env"], os.getcwd())           # as `python -m` sets sys.path
        sys.argv = [req["module"], *req["args"]]
        _run_module(req["module"])
    except SystemExit as err:
        return _exit_code(err)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def _run_module(name: str) -> None:
    """`python -m name`, as runpy runs it; a preloaded module from its code.

    runpy would find, read and unmarshal it again, and warns on stderr of a
    module already imported: its copy as __main__ is a second one, as it is
    for `python -m` when something imports the module by its name."""
    found = _MODULES.get(name)
    if found is None:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    code, spec = found
    sys.argv[0] = spec.origin
    _exec_as_main(code, __file__=spec.origin, __cached__=spec.cached,
                  __loader__=spec.loader, __package__=spec.parent, __spec__=spec)


def _exec_as_main(code: types.CodeType, **attrs) -> None:
    """Run compiled code as a fresh __main__ module with these attributes."""
    main = types.ModuleType("__main__")
    main.__dict__.update(attrs)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _environ(env: dict, first: str) -> None:
    """os.environ is `env`; sys.path is `first`, env's PYTHONPATH, then the
    interpreter's own directories, as a fresh interpreter would have them."""
    os.environ.clear()
    os.environ.update(env)
    extra = [d for d in env.get("PYTHONPATH", "").split(os.pathsep) if d]
    sys.path[:] = [first, *extra, *(p for p in BASE_PATH if p not in extra)]


def run_script(argv: list[str], env: dict) -> typing.NoReturn:
    """`python SCRIPT ARGS` in this process, then its exit as the interpreter's
    (threads joined, atexit, buffers): for a confined child of a fork of this
    server, which need not exec a fresh interpreter to be what one would be."""
    _name(os.path.basename(sys.executable))
    _environ(env, os.path.dirname(os.path.abspath(argv[0])))
    sys.argv = list(argv)
    code = 0
    try:
        compiled = _SCRIPTS.get(os.path.realpath(argv[0]))
        if compiled is None:
            runpy.run_path(argv[0], run_name="__main__")
        else:
            _exec_as_main(compiled, __file__=argv[0])
    except SystemExit as err:
        code = _exit_code(err)
    except BaseException:
        traceback.print_exc()
        code = 1
    leave(code)


def leave(code: int) -> typing.NoReturn:
    """Exit as the interpreter does where it shows (threads joined, atexit
    functions, weakref finalizers, stdout and stderr flushed), but without
    tearing down every module: in a fork of a server that teardown writes to
    all the memory the fork shares, and cost a forked worker 60 ms of CPU, five
    times what the rest of its start cost. As after os._exit, a file left open
    loses what it had not yet written: the course's own processes close theirs
    where they write them."""
    with contextlib.suppress(BaseException):
        threading._shutdown()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


def _name(module: str) -> None:
    """Show the module as the process's name (ps -o comm, /proc/PID/comm): its
    command line stays the server's."""
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_NAME, module.encode()[:15], 0, 0, 0)


def _send(conn: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):          # a caller gone: nobody to tell
        conn.send(json.dumps(msg).encode())


def _fork(req: dict, fds: list[int], conn: socket.socket,
          children: dict[int, socket.socket | None]) -> None:
    """Fork the child; its pid is answered once it is in its session or group,
    so a signal to that group at once reaches it (or an error, and no pid)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe() if req.get("pid_namespace") else (-1, -1)
    new_ns = go_r >= 0 and _new_pid_namespace()
    pid = -1
    try:
        pid = os.fork()
    except OSError as err:          # no process to be had: say so, serve on
        for fd in (ready_r, ready_w, go_r, go_w):
            if fd >= 0:
                os.close(fd)
        _send(conn, {"id": req.get("id"), "error": f"fork: {err}"})
        return
    finally:
        if new_ns and pid != 0:
            _our_pid_namespace()
    if pid == 0:
        os.close(ready_r)
        if go_r >= 0:
            os.close(go_w)
            if new_ns and os.read(go_r, 1) != b"g":     # not in the caller's group
                os.write(ready_w, b"cannot join the caller's process group")
                os._exit(1)
            os.close(go_r)
        leave(_child(req, fds, 0 if new_ns else os.getppid(), ready_w, new_ns))
    if go_r >= 0:
        os.close(go_r)
        if new_ns:
            with contextlib.suppress(OSError):
                # a group whose number it cannot see from its namespace: ours
                if req.get("pgid"):
                    os.setpgid(pid, req["pgid"])
                os.write(go_w, b"g")
        os.close(go_w)
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as ready:
        said = ready.read(400)
    if said != b"ok":
        children[pid] = None        # reaped, answered to nobody
        _send(conn, {"id": req.get("id"),
                     "error": said.decode(errors="replace") or "it died"})
        return
    children[pid] = conn
    _send(conn, {"id": req.get("id"),
                 "pid": pid, "args": [sys.executable, "-m", req["module"],
                                      *req["args"]]})


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)              # a group of its own
        with contextlib.suppress(ProcessLookupError):   # in a caller's group
            os.kill(pid, signal.SIGKILL)


def serve(preload: tuple[str, ...] = (), base: bool = True) -> int:
    """Requests on fd 0 and on each client connection passed over it
    ({"client": true} with one fd); replies on the connection asked.
    `base`: PRELOAD first (a server of processes that never use redis-py
    skips it: 13 MB less for each fork to copy)."""
    for name in (*(PRELOAD if base else ()), *preload):
        module = importlib.import_module(name)
        with contextlib.suppress(ImportError, OSError, AttributeError, TypeError):
            code = module.__loader__.get_code(name)
            _SCRIPTS[os.path.realpath(module.__spec__.origin)] = code
            if module.__spec__.submodule_search_locations is None:  # -m of a
                _MODULES[name] = (code, module.__spec__)     # package: __main__
    gc.freeze()         # what is imported by now, no fork need collect again
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # A kernel's interrupt reaches its whole group, this server too: it ends,
    # and what it started with it, as it always did, but without a traceback
    # (each child gets Python's own SIGINT handler back).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    children: dict[int, socket.socket | None] = {}  # pid -> the connection asking
    main = socket.socket(fileno=0)              # SOCK_SEQPACKET: one request each
    conns = {0: main}
    while 0 in conns:
        ready, _, _ = select.select([*conns, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        for fd in ready:
            if fd not in conns:
                continue
            conn = conns[fd]
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 64)
            except OSError:
                data, fds = b"", []
            if not data:            # a caller gone: what it started goes too
                _kill([pid for pid, c in children.items() if c is conn])
                del conns[fd]
                if fd:
                    conn.close()
                continue
            req = json.loads(data)
            if req.get("client") and len(fds) == 1:
                conns[fds[0]] = socket.socket(fileno=fds[0])
                continue
            _fork(req, fds, conn, children)
            for passed in fds:
                os.close(passed)
        _reap(children)
    _kill(children)              # the run is over: nothing it started outlives it
    while children:
        _reap(children, block=True)
    return 0


def _reap(children: dict[int, socket.socket | None], block: bool = False) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            _send(conn, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if block:
            return


# --- the caller's side -------------------------------------------------------------

class Starter:
    """One server for a run: `start()` gives a process handle like Popen's.

    `client()` gives another connection to the same server, for a process
    that did not start it (a forked child of ours, or one we pass the fd to):
    what it starts is answered on that connection, and dies when it closes.
    """

    def __init__(self, label: str = "", popen=subprocess.Popen,
                 env: dict | None = None, preload: tuple[str, ...] = (),
                 sock: socket.socket | None = None, base: bool = True):
        """`popen`: what starts the server (one that starts it on a thread that
        lives as long as the process, when the caller's thread may not);
        `env`: the server's own environment (default: ours); `preload`: more
        trusted modules it imports, after PRELOAD unless not `base`. `sock`: a
        client connection instead."""
        self.lock = threading.Lock()
        # (request id, what it started): a reply that comes after its start()
        # stopped waiting must not answer the next one
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.ids = itertools.count()
        self.changed = threading.Condition()
        self.gone = False
        self.proc = None
        self.owner = os.getpid()
        self.live: dict[int, WarmProcess] = {}      # started, not yet ended
        if sock is None:
            self.sock, theirs = socket.socketpair(socket.AF_UNIX,
                                                  socket.SOCK_SEQPACKET)
            with theirs:
                self.proc = popen(
                    [sys.executable, "-m", "handson.infra.warm_start",
                     *([] if base else ["--bare"]),
                     *(["--preload", ",".join(preload)] if preload else []),
                     *([label] if label else [])], stdin=theirs.fileno(), env=env,
                    stdout=subprocess.DEVNULL, preexec_fn=functools.partial(
                        redis_server.die_with_parent, os.getpid()))
        else:
            self.sock = sock
        threading.Thread(target=self._read, daemon=True).start()

    @classmethod
    def attach(cls, fd: int) -> Starter:
        """A client on the connection `fd` (from `client_fd()`), now ours."""
        return cls(sock=socket.socket(fileno=fd))

    def client_fd(self) -> int | None:
        """A new connection to the server, as an fd to pass or keep; None if
        the server is gone. Safe in a forked child: it only sends."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            try:
                socket.send_fds(self.sock, [b'{"client": true}'], [theirs.fileno()])
            except OSError:
                ours.close()
                return None
        return ours.detach()

    def _read(self) -> None:
        """Replies in the server's order: a pid's exit comes before its reuse."""
        live = self.live
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            if "pid" in msg or "error" in msg:
                if "pid" in msg:
                    live[msg["pid"]] = WarmProcess(self, msg["pid"], msg["args"])
                self.replies.put((msg.get("id"), live.get(msg.get("pid"))))
                continue
            with self.changed:
                if (h := live.pop(msg["exit"], None)) is not None:
                    h.returncode = msg["code"]
                self.changed.notify_all()
        with self.changed:
            self.gone = True
            self.changed.notify_all()
        self.replies.put((None, None))

    def start(self, module: str, args: list[str], env: dict, log: str | None,
              fds: dict[int, int] | None = None, cwd: str | None = None,
              pgid: int | None = None, pid_namespace: bool = False
              ) -> WarmProcess | None:
        """A forked `python -m module args` in `cwd` (default: ours), or None
        if the server cannot start it. `fds`: {fd in the child: fd of ours}
        (pass_fds, or a pipe for its stdout); the rest of 0, 1, 2 are /dev/null
        and `log`. `pgid`: None, a session of its own; 0, a group of its own in
        the server's session; else that process group (in the same session).
        `pid_namespace`: the child is PID 1 of a new PID namespace, if the
        server may make one (as root), e.g. a sandbox's init (`confine --init`)."""
        fds = fds or {}
        with self.lock:
            if self.gone:
                return None
            req = {"id": next(self.ids), "module": module, "args": args,
                   "env": env, "log": log, "cwd": os.path.abspath(cwd or os.getcwd()),
                   "fds": list(fds), "pgid": pgid, "pid_namespace": pid_namespace}
            deadline = time.monotonic() + START_TIMEOUT_S
            try:
                socket.send_fds(self.sock, [json.dumps(req).encode()],
                                list(fds.values()))
                while True:
                    said, started = self.replies.get(
                        timeout=max(0.0, deadline - time.monotonic()))
                    if said is None or said == req["id"]:   # gone, or ours
                        return started
                    if started is not None:   # one we stopped waiting for
                        started.kill()
            except (OSError, ValueError, queue.Empty):
                return None

    def start_piped(self, module: str, args: list[str], env: dict,
                    pipes: dict[int, str], fds: dict[int, int] | None = None,
                    **kw) -> WarmProcess | None:
        """`start` with a new pipe at each fd of `pipes` ("r": the child reads
        it, "w": it writes); our ends are in the handle's `ends` {fd: ours}."""
        made = {t: os.pipe() for t in pipes}
        theirs = {t: r if pipes[t] == "r" else w for t, (r, w) in made.items()}
        ours = {t: w if pipes[t] == "r" else r for t, (r, w) in made.items()}
        try:
            proc = self.start(module, args, env, None, {**theirs, **(fds or {})},
                              **kw)
        finally:
            for fd in theirs.values():
                os.close(fd)
        if proc is None:
            for fd in ours.values():
                os.close(fd)
            return None
        proc.ends = ours
        return proc

    def close(self) -> None:
        """Kill whatever is still running of what it started, then end it.
        (A forked child's copy leaves it alone: the connection is its parent's.)"""
        if os.getpid() != self.owner:
            return
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_OURS: dict[str, tuple[int, Starter]] = {}     # label -> (the process, its server)
_OURS_LOCK = [threading.Lock()]
os.register_at_fork(after_in_child=lambda: _OURS_LOCK.__setitem__(
    0, threading.Lock()))


def ours(label: str, **kw) -> Starter:
    """This process's server `label` (kw: Starter's), started on first use; a
    forked child of ours, or a process whose server is gone, starts another."""
    with _OURS_LOCK[0]:
        pid, s = _OURS.get(label, (0, None))
        if s is None or pid != os.getpid() or s.gone:
            s = Starter(label, **kw)
            _OURS[label] = (os.getpid(), s)
            # ended and waited for as we exit: its CPU and its children's then
            # count as ours (our parent's RUSAGE_CHILDREN), as a Popen's would
            atexit.register(s.close)
        return s


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

    def kill(self) -> None:
        """SIGKILL this process (not its group), as Popen.kill does."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        s = self.starter
        with s.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                if s.gone:          # nobody will say it ended: look again soon
                    left = GONE_POLL_S if left is None else min(left, GONE_POLL_S)
                s.changed.wait(left)
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _main(argv: list[str]) -> int:
    preload: tuple[str, ...] = ()
    base = argv[:1] != ["--bare"]
    argv = argv[0 if base else 1:]
    if argv[:1] == ["--preload"]:
        preload, argv = tuple(filter(None, argv[1].split(","))), argv[2:]
    return serve(preload, base)


if __name__ == "__main__":
    # served by the module as imported: the one whose `run_script` a child calls
    from handson.infra import warm_start
    sys.exit(warm_start._main(sys.argv[1:]))
