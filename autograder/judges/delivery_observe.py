"""Assignment 1's observation: the learner's functions called on the page's
stream, a short stream of redeliveries and the page's windows and leases, each
call's failure kept as data. It runs where the learner's code runs: in the
learner's kernel for a check cell, in the trusted harness for a grade
(`delivery_semantics`, which judges what this returns).
"""

from __future__ import annotations

import contextlib
import json
import signal
import traceback

DESIGNS = ("ack_before_work", "ack_after_work", "dedup_outside_tx", "dedup_in_tx")
WINDOWS = (100, 500, 1_000, 1_500, 2_000, 5_000)
QUICK_WINDOWS = (1_000, 2_000)
ALT_DELAY, ALT_WINDOWS = 1_000, (500, 1_000)      # the claim on another max delay
LEASES = (5, 15, 30, 60, 300)
QUICK_LEASES = (5, 300)
ALT_SEED, ALT_LEASES = 7, (5, 60)
SEED_WINDOW = 1_000                  # window_escapes once with seed ALT_SEED
N_LEASE, ALT_LEASE_N = 15, 5_000     # lease_doubles once with another n
ALT_CRASH, ALT_N = 0.05, 5_000       # a second crash stream, shorter: its claims
CALL_LIMIT_S = 20
KEY_JOBS = (0, 7, 123, 19_999)
SHORT_JOBS, SHORT_AGAIN = 12, (0, 1, 2, 5, 8, 9)  # the short stream's deliveries


class _TimeLimit(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: int):
    def on_alarm(signum, frame):
        raise _TimeLimit(f"did not return within {seconds} s (an endless loop?)")
    try:
        old = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:                  # not the main thread: no alarm available
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _call(ns: dict, fn_name: str, *args, _hung: set = set()):  # noqa: B006
    """Call the learner's function; any failure becomes data, never a crash.

    A function that ran past its limit once is not called again (`_hung` lives
    as long as the kernel), so one endless loop costs one limit, not eight.
    """
    fn = ns.get(fn_name)
    key = (fn_name, id(fn))
    if key in _hung:
        return {"error": f"{fn_name}() did not return within {CALL_LIMIT_S} s on "
                         "an earlier call (an endless loop?), so it was not run again"}
    if not callable(fn):
        return {"error": f"there is no function {fn_name}() in the notebook "
                         "(did its cell run?)"}
    try:
        with _limit(CALL_LIMIT_S):
            return {"value": fn(*args)}
    except NotImplementedError:
        return {"error": f"{fn_name}() still raises NotImplementedError"}
    except _TimeLimit as err:
        _hung.add(key)
        return {"error": f"{fn_name}() {err}"}
    except SystemExit as err:
        return {"error": f"{fn_name}() called sys.exit({err.code!r}); return a "
                         "value instead"}
    except BaseException as err:       # noqa: BLE001 - the learner's code
        tb = traceback.extract_tb(err.__traceback__)[-1:]
        where = f" (line {tb[0].lineno}: {tb[0].line})" if tb else ""
        return {"error": f"{fn_name}() raised {type(err).__name__}: {err}{where}"}


def _applied(result) -> dict | None:
    applied = getattr(result, "applied", result)
    return applied if isinstance(applied, dict) else None


def _summarize(result, jobs) -> dict:
    applied = _applied(result)
    if applied is None:
        return {"error": f"returned {type(result).__name__}, not a Sink "
                         "(or a dict job_id -> times applied)"}
    ids = [j for j, _ in jobs]
    return {"lost": sorted(j for j in ids if applied.get(j, 0) == 0),
            "once": sum(1 for j in ids if applied.get(j, 0) == 1),
            "dup": sorted(j for j in ids if applied.get(j, 0) > 1)}


def _counts(result, jobs) -> dict:
    """Times each job of a short stream was applied, keyed by its id."""
    applied = _applied(result)
    if applied is None:
        return _summarize(result, jobs)
    return {"applied": {str(j): applied.get(j, 0) for j, _ in jobs}}


def redeliveries() -> list[tuple[int, bool]]:
    """A short stream of jobs the page's stream never holds: each delivered
    once, then some delivered again after their own delivery, the one that
    ran or the one that crashed (a broker redelivers a job whose ack it never
    got); some that ran crash on that second delivery. None crashes twice:
    on the page a crash kills the worker mid-job once (`dispatch`), so a
    design built from the page's Broker and one that reads `crashes` per
    delivery (block 1) must agree on every job."""
    from handson.c01_job_scheduler import N

    first = [(N + i, i % 4 == 1) for i in range(SHORT_JOBS)]
    return first + [(N + i, i % 3 == 2 and not first[i][1]) for i in SHORT_AGAIN]


def fresh_order() -> list[int]:
    """The fresh worker's calls: first a job no stream holds, then the keyed
    jobs backwards, so a key numbered or drawn in the order one process met
    the jobs comes out another way there."""
    from handson.c01_job_scheduler import N

    return [N + SHORT_JOBS, *reversed(KEY_JOBS)]


def _fresh_keys(ns, fresh) -> dict:
    """dedup_key(j, 2) for the keyed jobs, asked of a new worker process."""
    problem = fresh()
    if problem:
        return {"error": "the fresh worker process (another interpreter, as "
                         "the redelivery's worker) could not load the module: "
                         + problem}
    got = {str(j): _call(ns, "dedup_key", j, 2) for j in fresh_order()}
    return {"keys": {j: {"a2": repr(r["value"])} if "value" in r else r
                     for j, r in got.items() if int(j) in KEY_JOBS}}


def observe(ns: dict, quick: bool = False, out_path: str | None = None) -> dict:
    """Run the learner's functions on the page's stream (and, in full, another).

    With out_path, the observations are written after every call, so a hang or
    a dead kernel still leaves the ones that finished.
    """
    from handson.c01_job_scheduler import stream

    obs: dict = {}

    def record(key, value):
        obs[key] = value
        if out_path:
            with open(out_path, "w") as fh:
                json.dump(obs, fh, default=repr)

    streams = {"page": stream()} if quick else {"page": stream(),
                                                 "alt": stream(ALT_N, ALT_CRASH)}
    short = redeliveries()
    for design in DESIGNS:
        for label, jobs in streams.items():
            res = _call(ns, design, list(jobs))
            record(f"{design}:{label}",
                   _summarize(res["value"], jobs) if "value" in res else res)
        for label in ("short", "again"):     # the same short stream, twice
            res = _call(ns, design, list(short))
            record(f"{design}:{label}",
                   _counts(res["value"], short) if "value" in res else res)
    keys = {}
    for j in KEY_JOBS:
        a, b = _call(ns, "dedup_key", j, 1), _call(ns, "dedup_key", j, 2)
        if "error" in a or "error" in b:
            keys = a if "error" in a else b
            break
        keys[str(j)] = {"same": a["value"] == b["value"], "a1": repr(a["value"]),
                        "a2": repr(b["value"])}
    if "error" not in keys:
        firsts = [_call(ns, "dedup_key", j, 1).get("value") for j in (0, 7, 123)]
        keys = {"pairs": keys, "distinct": len({repr(k) for k in firsts}) == 3}
    record("dedup_key", keys)
    fresh = getattr(ns, "fresh", None)     # the grader's host; not in a kernel
    if fresh is None:
        record("dedup_key:fresh", {"one_process": True})
    elif "pairs" in keys:
        record("dedup_key:fresh", _fresh_keys(ns, fresh))
    for w in (QUICK_WINDOWS if quick else WINDOWS):
        record(f"window:{w}:2000", _call(ns, "window_escapes", w, 2000, 17))
    if not quick:
        for w in ALT_WINDOWS:
            record(f"window:{w}:{ALT_DELAY}",
                   _call(ns, "window_escapes", w, ALT_DELAY, 17))
        record(f"window:{SEED_WINDOW}:2000:{ALT_SEED}",
               _call(ns, "window_escapes", SEED_WINDOW, 2000, ALT_SEED))
    windows = QUICK_WINDOWS if quick else WINDOWS
    record(f"window:{windows[0]}:2000:again",
           _call(ns, "window_escapes", windows[0], 2000, 17))
    for t in (QUICK_LEASES if quick else LEASES):
        record(f"lease:{t}:31", _call(ns, "lease_doubles", t, 20_000, 31))
    record(f"lease:{LEASES[0]}:31:again", _call(ns, "lease_doubles", LEASES[0],
                                                20_000, 31))
    if not quick:
        for t in ALT_LEASES:
            record(f"lease:{t}:{ALT_SEED}", _call(ns, "lease_doubles", t, 20_000,
                                                  ALT_SEED))
        record(f"lease:{N_LEASE}:31:{ALT_LEASE_N}",
               _call(ns, "lease_doubles", N_LEASE, ALT_LEASE_N, 31))
    return json.loads(json.dumps(obs, default=repr))
