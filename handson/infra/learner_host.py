"""Host ONE learner module in its own process and serve calls to it over a pipe.

    python learner_host.py MODULE        (a .py path or a dotted name)

The trusted side (`handson.infra.remote_module`) starts this script, usually under a
sandbox prefix, and never imports the learner's code itself: whatever the
module does on import or in a call, it can only change the replies it sends.

Protocol, JSON lines on the pipe the host was started with:
first the host says {"ready": {name: n_params | -1 (unknown) | null}} for each
public attribute (null: not callable) or {"load_error": why}; then for each
request {"id", "lane", "fn", "args", "kwargs", "redis": {"url", "decode"} |
null} it answers {"id", "ok": value} or {"id", "error": {"type", "message"}}.
Requests of one lane (one caller-side client) run in order on one thread;
lanes run side by side, like threads calling a module in one process. When
"redis" is set, the host makes its own client (one per lane) and passes it as
the first argument, which is how the queue contract's `r` crosses the pipe.
Tuples and bytes are tagged so they come back as they went; a few of the
caller's own objects cross as stand-ins (`decode`), and what happened to them
comes back as "notes". Threads the module left running are counted from
outside (`RemoteModule.threads`): the host runs one per lane besides its own.

Callbacks: a caller-side object passed as {"__local__": {"kind": "caller",
"ref", "methods", "attrs"}} (`remote_module.Caller`) becomes a proxy here whose
methods (only those listed) send {"id": the call's id, "callback": {"cb", "ref",
"method", "args", "kwargs"}} and block until the caller answers {"callback_reply":
cb, "ok" | "error"}. So an effect the harness must keep out of the learner's
reach (the mail provider's store, announcing a pause point) is performed by the
caller, on its own objects, in the middle of the learner's call.
A request's "pause_after_reply": k calls back the caller's object 0 right
after the call's k-th Redis reply (a schedule: the caller runs a rival then);
"pause_between_ids": a pattern calls it back, with the ids read, when the call
sends a request after a reply that held a string matching it.

Stdlib and redis only: the sandbox may hide the rest of the course's files. The
exceptions are stand-ins that are the course's own code, named by the caller:
"course_module" (a module, e.g. the reference queue `handson.q` handed to a
learner's relay) and "course_object" (an object made here from a class of the
course and its arguments, e.g. the effects database on the caller's target): a
caller that passes one must let the host read that module and what it imports.
"redis" is a client of the caller's Redis URL, for a client that is not the
first argument.
Before all of that, the harness's first line on the pipe sets the host up
({"host": {"parent", "direct", "skew"}}): the harness's pid, whether no sandbox
prefix sits between, and a skew in seconds for time.time(), time.time_ns() and
datetime's now/utcnow/today in this process (the caller's EO_CLOCK_SKEW_S), to
check that a module takes its deadlines from the server's clock. None of it is
in the environment.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import inspect
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from handson.infra.learner_module import apply_skew

_PR_SET_PDEATHSIG = 1


def encode(value, depth: int = 0):
    """JSON-ready value; tuples, bytes, other dicts and objects tagged."""
    if depth > 20:
        return {"__repr__": repr(value)[:200]}
    deeper = depth + 1
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, deeper) for v in value]}
    if isinstance(value, list):
        return [encode(v, deeper) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: encode(v, deeper) for k, v in value.items()}
        return {"__items__": [[encode(k, deeper), encode(v, deeper)]
                              for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).decode("latin-1")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict) and not callable(value):
        return {"__object__": [type(value).__name__, encode(
            {k: v for k, v in attrs.items() if isinstance(k, str)}, deeper)]}
    return {"__repr__": repr(value)}


def _object(type_name: str, attrs: dict):
    """A plain object with the attributes a learner's object had."""
    obj = type(type_name, (), {"__repr__": lambda self: f"<{type_name}>"})()
    obj.__dict__.update(attrs)
    return obj


class _QueueDouble:
    """Stand-in queue: each extend is the caller's to answer and count (a test
    double's count must live where no learner code runs)."""

    def __init__(self, notes: dict, caller):
        self.caller = caller

    def extend(self, r, job_id, attempt, lease_s) -> bool:
        return bool(self.caller.extend())


def _paced_work(notes: dict, caller):
    """Stand-in work(stop): the caller times and counts each step, and notes
    when it was told stop was set; here is only the asking."""
    def work(stop) -> None:
        while caller.step(stop.is_set()):
            pass
    return work


def _hashable(key):
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


_STANDINS = {"queue_double": _QueueDouble, "work": _paced_work}


class _Callbacks:
    """Round trips to the caller, in the middle of a call (see the docstring)."""

    def __init__(self):
        self.outbox = None
        self.write = threading.Lock()
        self.waiting: dict[int, list] = {}      # cb -> [event, reply]
        self.ids = iter(range(1, 1 << 62))
        self.lock = threading.Lock()

    def call(self, req_id, ref: int, method: str, args, kwargs):
        with self.lock:
            cb = next(self.ids)
            slot = [threading.Event(), None]
            self.waiting[cb] = slot
        msg = {"id": req_id, "callback": {"cb": cb, "ref": ref, "method": method,
                                          "args": encode(list(args)),
                                          "kwargs": encode(dict(kwargs))}}
        with self.write:
            self.outbox.write(json.dumps(msg) + "\n")
            self.outbox.flush()
        slot[0].wait()
        reply = slot[1] or {}
        if "error" in reply:
            err = reply["error"]
            name = str(err.get("type", "Exception"))
            raise type(name if name.isidentifier() else "Exception",
                       (Exception,), {})(err.get("message", ""))
        return decode(reply.get("ok"))

    def answer(self, reply: dict) -> None:
        slot = self.waiting.pop(reply.get("callback_reply"), None)
        if slot is not None:
            slot[1] = reply
            slot[0].set()

    def release_all(self) -> None:
        """The caller is gone: every waiting callback fails."""
        for cb in list(self.waiting):
            self.answer({"callback_reply": cb,
                         "error": {"type": "EOFError", "message": "caller gone"}})


CALLBACKS = _Callbacks()
_REQUEST = threading.local()


def _caller_proxy(spec: dict):
    """The caller's object here: its listed attributes, methods that call back."""
    ref, attrs = spec["ref"], dict(spec.get("attrs") or {})
    req_id = getattr(_REQUEST, "id", None)
    methods = list(spec.get("methods") or [])

    def method(name: str):
        def call(*args, **kwargs):
            return CALLBACKS.call(req_id, ref, name, args, kwargs)
        call.__name__ = name
        return call

    ns: dict = {"__repr__": lambda self: f"<{spec.get('name', 'caller')}>"}
    if "__call__" in methods:
        ns["__call__"] = lambda self, *a, **k: CALLBACKS.call(req_id, ref,
                                                              "__call__", a, k)
    proxy = type(str(spec.get("name", "Caller")), (), ns)()
    proxy.__dict__.update({k: decode(v) for k, v in attrs.items()})
    for name in methods:
        if name != "__call__":
            setattr(proxy, name, method(name))
    return proxy


_OBJECTS: dict = {}


def _course_object(module: str, name: str, args: list):
    """`module.name(*args)`, made here once per thread (a lane's calls share
    it, as in-process calls would share the caller's database connection)."""
    key = (module, name, json.dumps(args), threading.get_ident())
    if key not in _OBJECTS:
        obj = getattr(importlib.import_module(module), name)(*args)
        hook = getattr(obj, "on_statement", None)
        if callable(hook):          # a database: its statements are round trips
            hook(_statement)
        _OBJECTS[key] = obj
    return _OBJECTS[key]


_CLIENTS: dict = {}


def _redis(url: str, decode: bool = False):
    """A client of the caller's Redis (the sandbox lets only that one through)."""
    import redis

    key = (url, bool(decode))
    if key not in _CLIENTS:
        _CLIENTS[key] = redis.Redis.from_url(url, decode_responses=bool(decode),
                                             socket_timeout=30,
                                             socket_connect_timeout=5)
    return _CLIENTS[key]


def standin(kind: str, **params):
    """A stand-in made in this process, and the note it writes what it saw to:
    the harness makes the same ones itself when the module runs in-process."""
    note: dict = {"kind": kind}
    return _STANDINS[kind](note, **params), note


def decode(value, module=None, notes: list | None = None):
    """The value; {"__local__": ...} becomes a stand-in made here (see remote_module).

    Stand-ins stand for the caller's own objects (its module, a test double, the
    work function) and write what happened to them into `notes`.
    """
    if isinstance(value, list):
        return [decode(v, module, notes) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "__local__" in value and notes is not None:
            spec = dict(value["__local__"])
            kind = spec.pop("kind")
            if kind == "module":
                return module
            if kind == "caller":
                return _caller_proxy(spec)
            if kind == "course_object":     # named by the caller, never the learner
                return _course_object(spec["module"], spec["name"], spec["args"])
            if kind == "redis":
                return _redis(spec["url"], spec.get("decode", False))
            if kind == "course_module":     # named by the caller, never the learner
                return importlib.import_module(spec["name"])
            made, note = standin(kind, **{k: decode(v, module, notes)
                                          for k, v in spec.items()})
            notes.append(note)
            return made
        if len(value) == 1:
            (key, inner), = value.items()
            if key == "__tuple__":
                return tuple(decode(v) for v in inner)
            if key == "__bytes__":
                return inner.encode("latin-1")
            if key == "__repr__":
                return inner
            if key == "__items__":
                return {_hashable(decode(k)): decode(v) for k, v in inner}
            if key == "__object__":
                return _object(inner[0], decode(inner[1]))
        return {k: decode(v, module, notes) for k, v in value.items()}
    return value


def _die_with_parent(parent: int, direct: bool) -> None:
    """SIGKILL when the harness goes (PDEATHSIG); started straight by the
    harness (no sandbox prefix between), also poll, in case the learner unsets
    it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG,
                                                       signal.SIGKILL)
    except OSError:
        pass
    if not (parent and direct):
        return

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.2)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def _settings(line: str) -> dict:
    """The harness's first line: {"host": {"parent", "direct", "skew"}}.

    Sent on the pipe, not in the environment, so the learner's module sees the
    environment it would see anywhere else.
    """
    try:
        got = json.loads(line).get("host")
    except (ValueError, AttributeError):
        return {}
    return got if isinstance(got, dict) else {}


def _skew_clock(raw) -> None:
    """The skew the harness sent, applied as `learner_module.skew_clock` does
    in a worker (the wall clock and datetime's, before the module loads)."""
    try:
        skew = float(raw or 0)
    except (TypeError, ValueError):
        skew = 0.0
    apply_skew(skew)


def _load(spec: str):
    """The module, or raise RuntimeError with the lab's wording for the problem."""
    path = Path(spec)
    try:
        if spec.endswith(".py") or path.exists():
            if not path.is_file():
                raise RuntimeError(f"no module at {spec}")
            name = f"_learner_{abs(hash(str(path.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except RuntimeError:
        raise
    except SyntaxError as err:
        raise RuntimeError(f"{spec} has a syntax error on line {err.lineno}: "
                           f"{err.msg}") from None
    except SystemExit:
        raise RuntimeError(f"importing {spec} called sys.exit()") from None
    except BaseException as err:
        raise RuntimeError(f"importing {spec} raised {type(err).__name__}: "
                           f"{err}") from None


def _functions(module) -> dict:
    out = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        if not callable(value):
            out[name] = None
            continue
        try:
            out[name] = len(inspect.signature(value).parameters)
        except (TypeError, ValueError):
            out[name] = -1
    return out


_ARMED = threading.local()
TRAIL = 64              # round trips named in an answer's trail, at most


def _round_trips() -> int:
    """The call's round trips so far: its own Redis replies (no handshake,
    no script reload) and the statements of a database made here."""
    return (getattr(_ARMED, "replies", 0) - getattr(_ARMED, "uncounted", 0)
            + getattr(_ARMED, "statements", 0))


def _kill_between() -> None:
    """A round trip starts: the armed kill between round trips lands here,
    and the pause between them ("steps": stop after each round trip)."""
    if getattr(_ARMED, "connecting", False):
        return
    done, between = _round_trips(), getattr(_ARMED, "between", None)
    if between and done >= between:
        os.kill(os.getpid(), signal.SIGKILL)
    if getattr(_ARMED, "pause", None) == "steps" and done:
        CALLBACKS.call(getattr(_REQUEST, "id", None), 0, "__call__", [done], {})


def _note(step: str) -> None:
    trail = getattr(_ARMED, "trail", None)
    if trail is not None and len(trail) < TRAIL:
        trail.append(step if len(step) <= 90 else step[:87] + "...")


def _statement(sql: str) -> None:
    """A statement of a course database starts (its trace callback): one
    round trip, counted like a Redis reply for `crash_between_reply`."""
    _kill_between()
    _ARMED.statements = getattr(_ARMED, "statements", 0) + 1
    _note("SQL " + " ".join(str(sql).split()))


_PATCHED: list = []
_PATCH_LOCK = threading.Lock()


def _crash_after_replies() -> None:
    """The chaos run's mid-call crash point, here where the Redis calls are.

    Installed on the first request that asks for it or brings a Redis client
    (patching the class reaches every connection, made before or after), so a
    host that never talks to Redis never pays for importing it.

    A request may carry `crash_after_reply: k`: the host SIGKILLs itself right
    after the k-th Redis reply of that call (the harness, seeing its host die
    in a call it armed, logs the crash and dies too). Once installed, every
    answer says how many Redis replies its call read (`replies`), so the
    harness can draw k among a call's round trips. A host that ignores k, or
    lies about its replies, only makes its chaos run fall short of its fault
    quota: unknown, no pass.

    Or `crash_between_reply: k`: the host SIGKILLs itself when the call, having
    made at least k round trips, starts its next one: it dies between two round
    trips, and a call that makes no more after the k-th goes on. A round trip
    is a Redis reply, or a statement of a database the host made for the call
    (`_course_object`: its `on_statement` hook), so a call that writes SQLite
    and Redis can be killed between any two of its steps. Every answer names
    the call's round trips in order (`trail`), for the grader's witness.

    Or `pause_after_reply: k`: right after the k-th reply the host calls back
    the caller's object 0 (see Callbacks) and waits for its answer, so the
    harness runs a rival call while this one is stopped between round trips
    ("every": after each reply, to look at the server between them; "steps":
    as each round trip but the first starts, Redis or SQL, told how many went
    before, to look at both stores between them).
    Or `pause_between_ids: pattern`: once a reply of the call held strings
    matching the pattern (job ids), the host calls back object 0 with
    [replies, the ids] as the call sends its next request, once: stopped
    between reading a job and acting on it (a chaos run's reaper pause).
    A host that never pauses only shows the harness fewer schedules.
    """
    with _PATCH_LOCK:
        if not _PATCHED:
            _patch_read_response()
            _PATCHED.append(True)
        if "psycopg" in sys.modules and "psycopg" not in _PATCHED:
            _patch_psycopg()            # a queue in PostgreSQL: count its SQL
            _PATCHED.append("psycopg")


def loads_script(command) -> bool:
    """A packed request that is SCRIPT LOAD: a script cache miss's reload,
    no round trip of the call's own (nor is the failed EVALSHA before it)."""
    head = command[0] if isinstance(command, (list, tuple)) else command
    return b"SCRIPT\r\n$4\r\nLOAD" in bytes(head[:32]).upper()


def job_ids(reply, pattern: str, limit: int = 10_000) -> set[str]:
    """The strings matching `pattern` in a Redis reply (nested lists too),
    from its first `limit` items."""
    found: set[str] = set()
    todo, seen = [reply], 0
    while todo and seen < limit:
        x = todo.pop()
        seen += 1
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, (bytes, str)):
            text = x.decode(errors="replace") if isinstance(x, bytes) else x
            found.update(re.findall(pattern, text))
    return found


def command_name(command) -> str:
    """The name of the (first) command of a packed request (`*N $len NAME`)."""
    head = command[0] if isinstance(command, (list, tuple)) else command
    parts = bytes(head[:64]).split(b"\r\n")
    return parts[2].decode("latin-1").upper() if len(parts) > 2 else "?"


def _patch_read_response() -> None:
    from redis.connection import AbstractConnection

    original = AbstractConnection.read_response
    send, connect = AbstractConnection.send_packed_command, AbstractConnection.connect

    def send_packed_command(conn, command, *args, **kwargs):
        _kill_between()
        if getattr(_ARMED, "seen", None) and not getattr(_ARMED, "connecting", False):
            seen, _ARMED.seen, _ARMED.watch = sorted(_ARMED.seen), set(), None
            CALLBACKS.call(getattr(_REQUEST, "id", None), 0, "__call__",
                           [_ARMED.replies, seen], {})
        _ARMED.loading = loads_script(command)
        _ARMED.command = command_name(command)
        return send(conn, command, *args, **kwargs)

    def connecting(conn, *args, **kwargs):
        _ARMED.connecting = True
        try:
            return connect(conn, *args, **kwargs)
        finally:
            _ARMED.connecting = False

    def read_response(conn, *args, **kwargs):
        reply = original(conn, *args, **kwargs)
        _ARMED.replies = getattr(_ARMED, "replies", 0) + 1
        if getattr(_ARMED, "connecting", False) or getattr(_ARMED, "loading", False):
            # a new connection's handshake, a script reload: no round trip of
            # the call's own, for a kill between them
            _ARMED.uncounted = getattr(_ARMED, "uncounted", 0) + 1
            _ARMED.loading = False
        elif not getattr(_ARMED, "connecting", False):
            _note(f"Redis {getattr(_ARMED, 'command', '?')}")
            if getattr(_ARMED, "watch", None):
                _ARMED.seen.update(job_ids(reply, _ARMED.watch))
        after = getattr(_ARMED, "after", None)
        if after:
            _ARMED.after = after - 1
            if after == 1:
                os.kill(os.getpid(), signal.SIGKILL)
        pause = getattr(_ARMED, "pause", None)
        if pause in (_ARMED.replies, "every"):
            if pause != "every":
                _ARMED.pause = None
            CALLBACKS.call(getattr(_REQUEST, "id", None), 0, "__call__",
                           [_ARMED.replies], {})
        return reply

    AbstractConnection.read_response = read_response
    AbstractConnection.send_packed_command = send_packed_command
    AbstractConnection.connect = connecting


def _patch_psycopg() -> None:
    """Every statement a psycopg connection of this host sends, and every
    COMMIT (or ROLLBACK) a transaction block ends with, is a round trip,
    counted and named like a course database's statements (`_statement`)."""
    import psycopg

    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    leave = psycopg.Transaction.__exit__

    def counted_execute(cur, query, *args, **kwargs):
        _statement(_text(query))
        return execute(cur, query, *args, **kwargs)

    def counted_executemany(cur, query, *args, **kwargs):
        _statement(_text(query))
        return executemany(cur, query, *args, **kwargs)

    def counted_exit(tx, kind, *args):
        _statement("ROLLBACK" if kind else "COMMIT")
        return leave(tx, kind, *args)

    psycopg.Cursor.execute = counted_execute
    psycopg.Cursor.executemany = counted_executemany
    psycopg.Transaction.__exit__ = counted_exit


def _text(query) -> str:
    if isinstance(query, (str, bytes)):
        return query.decode(errors="replace") if isinstance(query, bytes) else query
    return type(query).__name__          # a psycopg.sql object: not rendered here


def serve(module, inbox, outbox) -> None:
    """One thread per caller-side client, so calls on several clients overlap."""
    import queue

    clients: dict = {}
    lanes: dict = {}
    write = threading.Lock()

    def reply(obj) -> None:
        with write:
            outbox.write(json.dumps(obj) + "\n")
            outbox.flush()

    def run(req) -> None:
        notes: list = []
        _REQUEST.id = req["id"]
        if (req.get("crash_after_reply") or req.get("pause_after_reply")
                or req.get("crash_between_reply") or req.get("pause_between_ids")
                or req.get("redis")):
            _crash_after_replies()
        _ARMED.after, _ARMED.replies = req.get("crash_after_reply"), 0
        _ARMED.between, _ARMED.uncounted = req.get("crash_between_reply"), 0
        _ARMED.statements, _ARMED.trail = 0, []
        _ARMED.pause = req.get("pause_after_reply")
        _ARMED.watch, _ARMED.seen = req.get("pause_between_ids"), set()
        try:
            args = decode(req.get("args", []), module, notes)
            kwargs = decode(req.get("kwargs", {}), module, notes)
            conn = req.get("redis")
            if conn:
                import redis

                key = (req.get("lane"), conn["url"], bool(conn.get("decode")))
                if key not in clients:
                    clients[key] = redis.Redis.from_url(
                        conn["url"], decode_responses=key[2], socket_timeout=30,
                        socket_connect_timeout=5)
                args = [clients[key], *args]
            value = getattr(module, req["fn"])(*args, **kwargs)
            _ARMED.after = _ARMED.pause = _ARMED.between = _ARMED.watch = None
            answer = {"id": req["id"], "ok": encode(value), "notes": notes}
            if _PATCHED:
                answer["replies"] = _ARMED.replies
                answer["trips"] = _round_trips()
            if _ARMED.trail:
                answer["trail"] = _ARMED.trail
            reply(answer)
        except BaseException as err:
            _ARMED.after = _ARMED.pause = _ARMED.between = _ARMED.watch = None
            reply({"id": req["id"], "notes": notes,
                   "error": {"type": type(err).__name__, "message": str(err)}})

    def lane(inbox_q) -> None:
        while True:
            run(inbox_q.get())

    CALLBACKS.outbox, CALLBACKS.write = outbox, write
    for line in inbox:
        req = json.loads(line)
        if "callback_reply" in req:
            CALLBACKS.answer(req)
            continue
        lane_key = req.get("lane")
        if lane_key not in lanes:
            lanes[lane_key] = queue.SimpleQueue()
            threading.Thread(target=lane, args=(lanes[lane_key],),
                             daemon=True).start()
        lanes[lane_key].put(req)
    CALLBACKS.release_all()


def main() -> int:
    # The pipe to the harness moves to private descriptors, so the learner's
    # print() goes to stderr and input() reads nothing.
    inbox = os.fdopen(os.dup(0), "r")
    settings = _settings(inbox.readline())
    _die_with_parent(int(settings.get("parent") or 0), bool(settings.get("direct")))
    outbox = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    here = Path(__file__).resolve().parent      # no `import q` from here
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    _skew_clock(settings.get("skew"))
    spec = sys.argv[1]
    sys.argv[:] = [spec]        # as `python MODULE` has it: no word of ours
    try:
        module = _load(spec)
    except RuntimeError as err:
        outbox.write(json.dumps({"load_error": str(err)}) + "\n")
        outbox.flush()
        return 0
    outbox.write(json.dumps({"ready": _functions(module)}) + "\n")
    outbox.flush()
    serve(module, inbox, outbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
