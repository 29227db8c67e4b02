"""The outbox's three functions killed between each two of their round trips.

The named points (`pause("between", n)`) kill a learner's save handler and
relay where the learner says the gap is. Here the gap is found, not told: each
of save_document, relay_once and summarize runs in a host process of its own
(`handson.infra.remote_module`), which counts the call's round trips (every
statement on the database the host opened, every Redis reply) and SIGKILLs
itself as the call starts its (k+1)-th, for k = 1, 2, ... until the call makes
no more. Then the system carries on as after a crash, and each function is
judged by its own invariant, the rest of the system being the course's:

- save_document killed: the course's relay and consumer run; every saved
  document has its job and every job its document.
- relay_once killed: the learner's relay runs again until it publishes
  nothing; every document is delivered (twice is fine: at least once).
- summarize killed: the job is delivered again (the killed consumer never
  acked it); the document's effect is applied exactly once.

Deterministic: the same module makes the same round trips on the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from handson import outbox
from handson.effects.sqldb import Database
from handson.infra import learner_module, remote_module
from handson.queues import checkbase, interleave

MAX_TRIPS = 24          # a call is killed after each of its first 24 round trips
DOCS = 2                # documents waiting for the killed relay


@dataclass
class Scene:
    """One function's schedule: the state before, the call, the carry-on
    (which returns what went wrong, or "")."""

    fn: str
    setup: Callable[[Database], None]
    call: Callable[[], object]
    carry_on: Callable[[Database], str]
    then: str                   # what the carry-on did, for the witness


FIX = {                 # what to change, in the learner's words
    "save_document": "put both inserts in ONE transaction (`with "
    "db.transaction():`), so a handler killed after any statement leaves the "
    "document and its outbox row together, or neither",
    "relay_once": "publish a row first and record it as sent (or delete it) "
    "only after its publish returned, row by row: a relay killed after any "
    "statement or Redis reply must leave every unpublished row unsent, so the "
    "next relay_once publishes it",
    "summarize": "write the key (summarized) and the effect (summaries) in ONE "
    "transaction, the effect only when the key is new: a consumer killed after "
    "any statement must leave both or neither, so the redelivery applies it",
}


def _scenes(bench, learner, kit) -> list[Scene]:
    ldb, lr, lqueue, lpause = kit
    r, q = bench.r, bench.queue

    def saved_vs_jobs(db: Database) -> str:
        outbox.relay_until_empty(db, r, q)
        jobs = set(outbox.consume_all(db, r, q))
        saved = outbox.documents(db)
        if saved - jobs:
            return f"document {sorted(saved - jobs)[0]} is saved but no job came"
        if jobs - saved:
            return f"a job came for document {sorted(jobs - saved)[0]}, never saved"
        return ""

    def saved(db: Database) -> None:
        for doc_id in range(DOCS):
            outbox.save(db, r, q, doc_id, f"document {doc_id}", "outbox")

    def relay_again(db: Database) -> str:
        outbox._until_zero(lambda: learner.relay_once(ldb, lr, lqueue, lpause)
                           or 0, max_batches=50)
        lost = sorted(set(range(DOCS)) - set(outbox.consume_all(db, r, q)))
        return f"document {lost[0]} was never delivered" if lost else ""

    def one_document(db: Database) -> None:
        db.run("INSERT INTO documents (id, body) VALUES (0, 'document 0')")

    def delivered_again(db: Database) -> str:
        learner.summarize(ldb, 0)
        n = db.query("SELECT count(*) FROM summaries WHERE doc_id = 0")[0][0]
        return "" if n == 1 else f"document 0 was summarized {n} times"

    return [
        Scene("save_document", lambda db: None,
              lambda: learner.save_document(ldb, 0, "document 0", lpause),
              saved_vs_jobs, "the relay published every outbox row and a "
              "consumer took every job"),
        Scene("relay_once", saved,
              lambda: learner.relay_once(ldb, lr, lqueue, lpause),
              relay_again, f"relay_once ran again until it returned 0 "
              f"({DOCS} documents were waiting) and a consumer took every job"),
        Scene("summarize", one_document, lambda: learner.summarize(ldb, 0),
              delivered_again, "the job came again (the killed consumer never "
              "acked it) and summarize(db, 0) ran"),
    ]


def _where(fn: str, k: int, trail: list[str]) -> str:
    """'relay_once killed after round trip 2 of 5 (SQL ...), before ...'."""
    of = f" of {len(trail)}" if len(trail) > k else ""
    text = f"{fn} killed (SIGKILL) after round trip {k}{of}"
    if len(trail) >= k:
        text += f" ({trail[k - 1]})"
    if len(trail) > k:
        text += f", before {trail[k]}"
    return text


def _state(seer, db: Database) -> tuple:
    """Every row of the outbox's tables and every Redis key with its contents
    (`seer`: a client that decodes replies): what a kill leaves."""
    return (tuple(tuple(db.query(f"SELECT * FROM {t}")) for t in outbox.TABLES),
            interleave._state(seer))


def _kill_points(bench, learner, s: Scene) -> tuple[list[int], list[str]]:
    """The round trips after which a kill leaves a state of its own, and the
    round trips named. One plain run, looking at the database and Redis as
    each round trip starts (the call waits): a kill after round trip k leaves
    them as they were then. Where nothing changed since round trip k - 1 (a
    read, a write not yet committed), the kill is the same as one earlier; a
    kill that leaves the state before the call is a call that never ran."""
    db, seer = bench.fresh(), checkbase._client(bench.redis_url)
    try:
        s.setup(db)
        states = {0: _state(seer, db)}
        learner.arm_pause("steps", lambda k: states.setdefault(k, _state(seer, db)))
        s.call()
        trail = learner.trail(s.fn)
        _hidden(s.fn, states[0], _state(seer, db), trail)
    finally:
        db.close()
        seer.close()
    last = min(max(states), MAX_TRIPS)
    return [k for k in range(1, last + 1) if states[k] != states[k - 1]], trail


class Hidden(RuntimeError):
    """The call changed a store without a round trip its host could count."""


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


def _each_kill(bench, learner, s: Scene) -> tuple[int, dict | None]:
    """Kill s.fn after round trip k for each k that leaves a state of its
    own; (kills, the first failure)."""
    points, trail = _kill_points(bench, learner, s)
    for k in points:
        db = bench.fresh()
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
                       "schedule": f"{_where(s.fn, k, trail)}; then {s.then}: "
                                   f"{problem}",
                       "fix": FIX[s.fn]}
    return len(points), None


def killed_between_trips(bench) -> dict:
    """Each function killed after each of its round trips, judged; plain data."""
    prefix = remote_module.prefix_from_env() or []
    try:
        learner = remote_module.load(bench.module, prefix, "your outbox module")
    except learner_module.ModuleProblem as err:
        return {"error": str(err)}
    a = SimpleNamespace(db=bench.target, redis=bench.redis_url,
                        queue=bench.queue_spec)
    kit = outbox._stand_ins(a, outbox._no_pause)
    kills: dict[str, int] = {}
    try:
        for scene in _scenes(bench, learner, kit):
            try:
                kills[scene.fn], failed = _each_kill(bench, learner, scene)
            except Hidden as err:
                return {"error": str(err)}
            except (remote_module.LearnerError, remote_module.LearnerProcessDied,
                    RuntimeError) as err:
                return {"error": f"{scene.fn}: {type(err).__name__}: {err}"}
            if failed:
                return {"kills": kills, "failed": failed}
    finally:
        learner.close()
    return {"kills": kills, "failed": None}
