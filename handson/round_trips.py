"""A learner's function killed between each two of its round trips.

A named point (`pause("between", n)`) kills the learner's code where the
learner says the gap is. Here the gap is found, not told: the function runs in
a host process of its own (`handson.infra.remote_module`), which counts the
call's round trips, every statement on the database the host opened and every
Redis reply, and SIGKILLs itself as the call starts its (k+1)-th. Then the
system carries on as after a crash (a `Scene` says how), and what it left is
judged by the assignment's invariant.

Only kills that leave a state of their own are tried: one plain run looks at
the database and Redis as each round trip starts, and a kill where nothing
changed since the round trip before (a read, a write not yet committed) is the
same as the one before it. Deterministic: the same module makes the same round
trips on the same state.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from handson.effects.sqldb import Database, is_postgres
from handson.infra import learner_module, remote_module, trusted_read
from handson.queues import checkbase, interleave

MAX_TRIPS = 24          # a call is killed after each of its first 24 round trips


@dataclass
class Scene:
    """One function's schedules: the state before, the call, the carry-on
    (which returns what went wrong, or "") and the words for the witness."""

    fn: str
    setup: Callable[[Database], None]
    call: Callable[[], object]
    carry_on: Callable[[Database], str]
    then: str                   # what the carry-on did
    fix: str                    # what to change, in the learner's words
    rival: Callable[[], object] | None = None   # the same work, another host


@dataclass
class Stores:
    """Where the learner's call leaves its state: `fresh()` empties them and
    opens the database; `tables` are read for the state; Redis, if any."""

    fresh: Callable[[], Database]
    tables: tuple[str, ...]
    redis_url: str | None = None


class Hidden(RuntimeError):
    """The call changed a store without a round trip its host could count."""


def _state(stores: Stores, db: Database, seer) -> tuple:
    """Every row of the tables and every Redis key with its contents; the
    tables read only once they are plain ones (no view, no trigger)."""
    wrong = db.plain_tables(stores.tables)
    if wrong:
        raise trusted_read.Untrusted(wrong)
    rows = tuple(tuple(db.query(f"SELECT * FROM {t}")) for t in stores.tables)
    return rows, (interleave._state(seer) if seer is not None else [])


def _hidden(fn: str, before: tuple, after: tuple, trail: list[str]) -> None:
    """A call that changed the database (or Redis) made at least one statement
    (or reply) there that its host saw; one that did not hid its round trips
    (its own connection, the trace callback unset), and could hide a gap."""
    for i, (store, word) in enumerate((("the database", "SQL"),
                                       ("Redis", "Redis"))):
        if before[i] != after[i] and not any(t.startswith(word) for t in trail):
            raise Hidden(f"{fn} changed {store}, yet its host counted no "
                         f"{word} round trip: use the db and r you are given, "
                         "as they are, so the grader can kill your code between "
                         "any two of its steps")


def _kill_points(stores: Stores, learner, s: Scene) -> tuple[list[int], list[str]]:
    """The round trips after which a kill leaves a state of its own, and the
    round trips named. A kill that leaves the state before the call is a call
    that never ran; one after the last round trip, a call that returned."""
    db = stores.fresh()
    seer = checkbase._client(stores.redis_url) if stores.redis_url else None
    try:
        s.setup(db)
        states = {0: _state(stores, db, seer)}
        learner.arm_pause("steps", lambda k: states.setdefault(
            k, _state(stores, db, seer)))
        s.call()
        trail = learner.trail(s.fn)
        _hidden(s.fn, states[0], _state(stores, db, seer), trail)
    finally:
        db.close()
        if seer is not None:
            seer.close()
    last = min(max(states), MAX_TRIPS)
    return [k for k in range(1, last + 1) if states[k] != states[k - 1]], trail


def where(fn: str, k: int, trail: list[str]) -> str:
    """'relay_once killed after round trip 2 of 5 (SQL ...), before ...'."""
    of = f" of {len(trail)}" if len(trail) > k else ""
    text = f"{fn} killed (SIGKILL) after round trip {k}{of}"
    if len(trail) >= k:
        text += f" ({trail[k - 1]})"
    if len(trail) > k:
        text += f", before {trail[k]}"
    return text


def each_kill(stores: Stores, learner, s: Scene) -> tuple[int, dict | None]:
    """Kill s.fn after round trip k for each k that leaves a state of its
    own; (kills, the first failure as plain data)."""
    points, trail = _kill_points(stores, learner, s)
    for k in points:
        db = stores.fresh()
        try:
            s.setup(db)
            learner.arm_crash_between(k)
            try:
                s.call()
                return k - 1, None      # no round trip k + 1 this time
            except remote_module.LearnerProcessDied:
                pass
            problem = s.carry_on(db)
        finally:
            db.close()
        if problem:
            return k, {"function": s.fn, "round_trip": k,
                       "schedule": f"{where(s.fn, k, trail)}; then {s.then}: "
                                   f"{problem}",
                       "fix": s.fix}
    return len(points), None


LOCKED = object()       # the rival's write waited on the stopped call's transaction


def each_stop(stores: Stores, learner, s: Scene) -> tuple[int, dict | None]:
    """Stop s.fn after round trip k, k = 1 .. its last but one, while
    `s.rival()` (the same work from another host) runs to its end, then let
    it go on; (stops, the first failure). A rival that finds the database
    locked (the stopped call holds a write transaction: no gap there, the
    rival would only wait) does not count; it raises so, on a short busy
    timeout."""
    db = stores.fresh()
    try:
        s.setup(db)
        before = _state(stores, db, None)
        # a plain run: the round trips, named; armed as the stops will be, so
        # its host counts the Redis replies among them too
        learner.arm_pause("steps", lambda k: None)
        s.call()
        trail = learner.trail(s.fn)
        try:
            after = _state(stores, db, None)
        except (sqlite3.Error, trusted_read.Untrusted):
            after = None    # tables the call broke: the stops' own runs say so
        if after is not None:
            _hidden(s.fn, before, after, trail)
    finally:
        db.close()
    stops = 0
    for k in range(1, min(len(trail), MAX_TRIPS + 1)):
        db = stores.fresh()
        seen: dict = {}

        def meanwhile(at, k=k, seen=seen):
            if at == k and not seen:
                try:            # never raise here: the learner's call waits
                    seen["rival"] = s.rival()
                except remote_module.LearnerError as err:
                    seen["rival"] = LOCKED if "locked" in str(err) else err
                except remote_module.LearnerProcessDied as err:
                    seen["rival"] = err
        try:
            s.setup(db)
            learner.arm_pause("steps", meanwhile)
            s.call()
            if isinstance(seen.get("rival"), Exception):
                raise seen["rival"]
            if seen.get("rival", LOCKED) is LOCKED:
                continue
            stops += 1
            problem = s.carry_on(db)
        finally:
            db.close()
        if problem:
            held = where(s.fn, k, trail).replace("killed (SIGKILL)", "stopped")
            return stops, {"function": s.fn, "round_trip": k,
                           "schedule": f"{held}; {s.then}: {problem}",
                           "fix": s.fix}
    return stops, None


def run_scenes(stores: Stores, learner, scenes: list[Scene],
               each: Callable = each_kill) -> dict:
    """Each scene's kills (or stops: `each`), until one fails: {"kills",
    "failed"} or {"error"}."""
    kills: dict[str, int] = {}
    for scene in scenes:
        try:
            kills[scene.fn], failed = each(stores, learner, scene)
        except (Hidden, trusted_read.Untrusted) as err:
            return {"error": str(err)}
        except (remote_module.LearnerError, remote_module.LearnerProcessDied,
                RuntimeError) as err:
            return {"error": f"{scene.fn}: {type(err).__name__}: {err}"}
        except sqlite3.Error as err:    # a fresh start found it locked
            return {"error": f"{scene.fn}: the database stayed locked after a "
                             f"run ({err}): a transaction left open on the "
                             "worker's connection?"}
        if failed:
            return {"kills": kills, "failed": failed}
    return {"kills": kills, "failed": None}


RIVAL_WAIT_S = 0.1      # a rival's busy timeout: the stopped call never lets go


def database(target: str, wait_s: float | None = None):
    """The stand-in for a course database the host opens itself (SQLite file:
    by its absolute path); `wait_s`: its busy timeout, else the course's."""
    args = [os.path.abspath(target)] + ([wait_s] if wait_s is not None else [])
    return remote_module.Local("course_object", module=Database.__module__,
                               name=Database.__name__, args=args)


SQLITE_ONLY = ("the kills between round trips count SQLite statements; run them "
               "on a SQLite file, not PostgreSQL")


def hosted(spec: str, what: str):
    """The learner's module in a host of its own (confined as the grader's
    runs are, when they are); ModuleProblem if it cannot load."""
    return remote_module.load(spec, remote_module.prefix_from_env() or [], what)


class Unrunnable(Exception):
    """Why the round trips cannot be judged here; its text is the error shown."""


def hosts(target: str, spec: str, what: str, n: int = 1) -> list:
    """n hosts of the learner's module for a run on SQLite `target`; Unrunnable
    on PostgreSQL or if the module cannot load (the hosts started are closed)."""
    if is_postgres(target):
        raise Unrunnable(SQLITE_ONLY)
    started: list = []
    try:
        for _ in range(n):
            started.append(hosted(spec, what))
    except learner_module.ModuleProblem as err:
        for host in started:
            host.close()
        raise Unrunnable(str(err)) from None
    return started
