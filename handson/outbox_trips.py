"""The outbox's three functions killed between each two of their round trips.

Each of save_document, relay_once and summarize is killed after each of its
round trips, SQL statements and Redis replies (`handson.round_trips`), where
the learner named a point or not. Then the system carries on as after a crash,
and each function is judged by its own invariant, the rest of the system being
the course's:

- save_document killed: the course's relay and consumer run; every saved
  document has its job and every job its document.
- relay_once killed: the learner's relay runs again until it publishes
  nothing; every document is delivered (twice is fine: at least once).
- summarize killed: the job is delivered again (the killed consumer never
  acked it); the document's effect is applied exactly once.
"""

from __future__ import annotations

import inspect
import os
import sqlite3
from types import SimpleNamespace

from handson import outbox
from handson.effects.sqldb import Database
from handson.infra import remote_module, trusted_read
from handson.round_trips import (
    LOCKED,
    RIVAL_WAIT_S,
    Scene,
    Stores,
    Unrunnable,
    database,
    each_stop,
    hosts,
    run_scenes,
)

DOCS = 2                # documents waiting for the killed relay


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


def _one_document(db: Database) -> None:
    db.run("INSERT INTO documents (id, body) VALUES (0, 'document 0')")


def _summarized_once(db: Database) -> str:
    n = db.query("SELECT count(*) FROM summaries WHERE doc_id = 0")[0][0]
    return "" if n == 1 else f"document 0 was summarized {n} times"


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

    def delivered_again(db: Database) -> str:
        learner.summarize(ldb, 0)
        return _summarized_once(db)

    return [
        Scene("save_document", lambda db: None,
              lambda: learner.save_document(ldb, 0, "document 0", lpause),
              saved_vs_jobs, "the relay published every outbox row and a "
              "consumer took every job", FIX["save_document"]),
        Scene("relay_once", saved,
              lambda: learner.relay_once(ldb, lr, lqueue, lpause),
              relay_again, f"relay_once ran again until it returned 0 "
              f"({DOCS} documents were waiting) and a consumer took every job",
              FIX["relay_once"]),
        Scene("summarize", _one_document, lambda: learner.summarize(ldb, 0),
              delivered_again, "the job came again (the killed consumer never "
              "acked it) and summarize(db, 0) ran", FIX["summarize"]),
    ]


def killed_between_trips(bench) -> dict:
    """Each function killed after each of its round trips, judged; plain data."""
    try:
        [learner] = hosts(bench.target, bench.module, "your outbox module")
    except Unrunnable as err:
        return {"error": str(err)}
    a = SimpleNamespace(db=bench.target, redis=bench.redis_url,
                        queue=bench.queue_spec)
    kit = outbox._stand_ins(a, outbox._no_pause)
    try:
        return run_scenes(Stores(bench.fresh, outbox.TABLES, bench.redis_url),
                          learner, _scenes(bench, learner, kit))
    finally:
        learner.close()


FIX_RIVAL = ("check the key and write it in the SAME transaction as the "
             "effect (`with db.transaction():` around the check, the key and "
             "the effect, or INSERT ... ON CONFLICT DO NOTHING RETURNING as the "
             "check): two consumers of one job at once must apply it once")


def interleaved_consumers(bench) -> dict:
    """summarize stopped after each of its round trips while another
    consumer, in a host of its own, summarizes the same document to the end
    (a job delivered to two workers at once); one effect must remain."""
    try:
        learner, other = hosts(bench.target, bench.module, "your outbox module", 2)
    except Unrunnable as err:
        return {"error": str(err)}
    ldb, rdb = database(bench.target), database(bench.target, RIVAL_WAIT_S)
    scene = Scene("summarize", _one_document, lambda: learner.summarize(ldb, 0),
                  lambda db: _summarized_once(db), "meanwhile another consumer "
                  "ran summarize(db, 0) to its end; then the first went on",
                  FIX_RIVAL, rival=lambda: other.summarize(rdb, 0))
    try:
        return run_scenes(Stores(bench.fresh, outbox.TABLES), learner, [scene],
                          each=each_stop)
    finally:
        learner.close()
        other.close()


# --- writers racing the relay ----------------------------------------------------

# Outbox ids are taken before their rows commit (a sequence): rows 2 and 4 are
# waiting when the relay starts, rows 3 and 1 were taken earlier by writers
# still in flight, and row 5 is a writer that begins while the relay runs.
# Each run shifts the ids and the documents by offsets of its own (`offset`),
# so a module cannot tell the check's rows by their numbers.
WAITING = {2: 0, 4: 1}          # outbox id: document, committed before the call
RACING = {3: 2, 1: 3, 5: 4}     # committed while relay_once is stopped, in order
RACE_THEN = ("then relay_once went on, ran again until it returned 0, and a "
             "consumer took every job")
FIX_RACE = ("mark sent (or delete) exactly the rows this call read and "
            "published, by their ids (`WHERE id = ?` per row, or `WHERE id IN "
            "(...)`): a row a writer commits while the relay runs, whatever its "
            "id, is one the relay never read, and must stay unsent for the next "
            "relay_once")
FIX_WRITER = ("leave the outbox's rows to the writers: relay_once reads the "
              "unsent rows, publishes them and marks (or deletes) them, and "
              "inserts no row and changes no table, or a writer's commit fails")
FIX_BATCH = ("mark sent (or delete) exactly the rows this call read and "
             "published, by their ids: with `LIMIT batch`, `WHERE sent = 0` "
             "also marks the unsent rows beyond the batch, never published")
PROBE_BATCH = 2         # the batch relay_once is given when no writer could race
TEMPLATE_BATCH = 100    # relay_once's default batch in the notebook's template


def offset() -> int:
    """A run's own offset for ids or documents: from os.urandom, never 0."""
    return 1 + int.from_bytes(os.urandom(4), "big") % 100_000


def _shifted(rows: dict[int, int], shift: tuple[int, int]) -> dict[int, int]:
    return {i + shift[0]: d + shift[1] for i, d in rows.items()}


def race_words(racing: dict[int, int], committed: list[int], last_waiting: int,
               stopped: str) -> str:
    """'they committed outbox row 13, then row 11 (ids taken before row 14
    committed, ...)', naming only the rows that committed; `stopped`: why
    the next writer did not ("locked"), or ""."""
    row = {d: i for i, d in racing.items()}
    ids = [row[d] for d in committed]
    low = [i for i in ids if i < last_waiting]
    note = (f" ({'ids' if len(low) > 1 else 'an id'} taken before row "
            f"{last_waiting} committed, so lower than rows it may have "
            "published)")
    words = ", then row ".join(
        f"{i}{note if low and i == low[-1] else ''}" for i in ids)
    text = (f"they committed outbox row {words}" if ids else
            "they committed no row")
    if stopped == "locked":
        text += "; then the next writer found the database locked"
    return text


def writer_failed(db: Database, outbox_id: int, doc_id: int,
                  err: sqlite3.Error) -> str:
    """The grader's writer could not commit a row: which, why, and what the
    module left where the row was to go."""
    text = (f"the grader's writer could not commit outbox row {outbox_id} "
            f"(document {doc_id}): {type(err).__name__}: {err}")
    try:
        held = db.query("SELECT doc_id, sent FROM outbox WHERE id = ?",
                        (outbox_id,))
        doc = db.query("SELECT 1 FROM documents WHERE id = ?", (doc_id,))
    except sqlite3.Error:
        return text             # the tables themselves are gone or changed
    if held:
        text += (f"; the outbox already held row {outbox_id} (document "
                 f"{held[0][0]}, sent {held[0][1]}), which the grader never wrote")
    if doc:
        text += (f"; documents already held document {doc_id}, which the "
                 "grader never wrote")
    return text


class _Race:
    """The writers, in a connection of our own with a short busy timeout:
    what they committed (documents), and why the rest did not."""

    def __init__(self, target: str, racing: dict[int, int]):
        self.target, self.racing = target, racing
        self.committed: list[int] = []
        self.stopped = ""       # "locked", or the failed writer's words

    def reset(self) -> None:
        self.committed.clear()
        self.stopped = ""

    def __call__(self):
        """The documents committed, or LOCKED if the stopped relay holds the
        write lock (no writer can commit inside that call)."""
        try:
            with Database(self.target, RIVAL_WAIT_S) as db:
                for outbox_id, doc_id in self.racing.items():
                    try:
                        outbox.save_with_id(db, outbox_id, doc_id,
                                            f"document {doc_id}")
                    except sqlite3.Error as err:
                        if "locked" in str(err):
                            raise
                        self.stopped = writer_failed(db, outbox_id, doc_id, err)
                        return list(self.committed)
                    self.committed.append(doc_id)
        except sqlite3.OperationalError as err:
            if "locked" not in str(err):
                raise
            self.stopped = "locked"
            return list(self.committed) if self.committed else LOCKED
        return list(self.committed)


def writers_race_relay(bench, shift: tuple[int, int] | None = None) -> dict:
    """relay_once stopped after each of its round trips while writers commit
    outbox rows, lower ids than ones it read among them, out of id order; the
    relay then goes on and runs again: every committed document delivered.
    `shift`: the offsets of ids and documents (a run's own, else)."""
    try:
        [learner] = hosts(bench.target, bench.module, "your outbox module")
    except Unrunnable as err:
        return {"error": str(err)}
    shift = shift or (offset(), offset())
    waiting, racing = _shifted(WAITING, shift), _shifted(RACING, shift)
    a = SimpleNamespace(db=bench.target, redis=bench.redis_url,
                        queue=bench.queue_spec)
    kit = outbox._stand_ins(a, outbox._no_pause)
    race = _Race(bench.target, racing)

    def setup(db: Database) -> None:
        race.reset()
        for outbox_id, doc_id in waiting.items():
            outbox.save_with_id(db, outbox_id, doc_id, f"document {doc_id}")

    def relay_again(db: Database) -> str:
        said = race_words(racing, race.committed, max(waiting), race.stopped)
        if race.stopped not in ("", "locked"):
            return f"{said}; then {race.stopped}"
        outbox._until_zero(lambda: learner.relay_once(*kit) or 0, max_batches=50)
        got = set(outbox.consume_all(db, bench.r, bench.queue))
        row = {d: i for i, d in (*waiting.items(), *racing.items())}
        lost = [d for d in [*waiting.values(), *race.committed] if d not in got]
        if not lost:
            return ""
        when = ("committed while relay_once was stopped" if lost[0] in
                race.committed else "waiting before the call")
        return (f"{said}; {RACE_THEN}: document {lost[0]} (outbox row "
                f"{row[lost[0]]}, {when}) was never delivered")

    scene = Scene("relay_once", setup, lambda: learner.relay_once(*kit),
                  relay_again, "meanwhile writers ran", FIX_RACE, rival=race)
    try:
        out = run_scenes(Stores(bench.fresh, outbox.TABLES, bench.redis_url),
                         learner, [scene], each=each_stop)
        if out.get("failed") and race.stopped not in ("", "locked"):
            out["failed"]["fix"] = FIX_WRITER
        if out.get("kills") == {"relay_once": 0} and out["failed"] is None:
            return _beyond_batch(bench, learner, kit, shift) or out
        return out
    finally:
        learner.close()


def _beyond_batch(bench, learner, kit, shift: tuple[int, int]) -> dict | None:
    """No stop could race the relay (it holds its write transaction from its
    first statement): run it once with one unsent row more than its batch, and
    see that it marked nothing it did not publish; the failure, or None."""
    takes = len(inspect.signature(learner.relay_once).parameters) >= 5
    batch = PROBE_BATCH if takes else TEMPLATE_BATCH
    rows = {shift[0] + 1 + n: shift[1] + n for n in range(batch + 1)}
    db = bench.fresh()
    try:
        with db.transaction():
            for outbox_id, doc_id in rows.items():
                db.run("INSERT INTO documents (id, body) VALUES (?, ?)",
                       (doc_id, f"document {doc_id}"))
                db.run("INSERT INTO outbox (id, doc_id) VALUES (?, ?)",
                       (outbox_id, doc_id))
        learner.relay_once(*kit, *([batch] if takes else []))
        got = set(outbox.consume_all(db, bench.r, bench.queue))
        unsent = {i for (i,) in db.query("SELECT id FROM outbox WHERE sent = 0")}
    except (remote_module.LearnerError, remote_module.LearnerProcessDied) as err:
        return {"error": f"relay_once: {type(err).__name__}: {err}"}
    finally:
        db.close()
    lost = [i for i, d in rows.items() if i not in unsent and d not in got]
    if not lost:
        return None
    call = "relay_once(db, r, queue, pause" + (f", {batch})" if takes else ")")
    return {"kills": {"relay_once": 0}, "failed": {
        "function": "relay_once", "round_trip": 0,
        "schedule": "every stop of relay_once found the database locked (it "
                    "holds its write transaction throughout), so no writer "
                    f"could race it; then {call} ran once with {len(rows)} "
                    f"unsent rows (outbox rows {_and(list(rows))}): it "
                    f"published documents {_and(sorted(got))} and marked "
                    f"outbox row {lost[0]} (document {rows[lost[0]]}) sent, "
                    "never published",
        "fix": FIX_BATCH}}


def _and(items: list) -> str:
    """'1, 2 and 3'; '1 to 101' for a longer unbroken run."""
    if len(items) > 3 and items == list(range(items[0], items[-1] + 1)):
        return f"{items[0]} to {items[-1]}"
    words = [str(x) for x in items] or ["none"]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 \
        else words[0]


# --- long-running consumers -------------------------------------------------------

# (worker, document): each worker one host and one connection, kept across its
# deliveries; document 1 comes again to A after B applied it, 0 to B after A.
# The documents are shifted by a run's own offset, as the writers' rows are.
DELIVERIES = (("A", 0), ("B", 1), ("A", 1), ("B", 0))
FIX_REUSED = ("decide from the database, inside the transaction, whether the "
              "key is new (INSERT ... ON CONFLICT DO NOTHING RETURNING, or a "
              "SELECT in the same transaction): nothing kept per connection or "
              "per process (a cache, a TEMP table, last_insert_rowid()) knows "
              "what another worker's connection committed, or outlives its "
              "transaction")


def _delivery(n: int, worker: str, doc_id: int, seen: list) -> str:
    """'delivery 3 of 4: document 1 to worker A (its connection had taken
    document 0; worker B had taken document 1)'."""
    had = [f"document {d}" for w, d in seen if w == worker]
    others = [f"worker {w} had taken document {d}" for w, d in seen
              if w != worker and d == doc_id]
    ctx = ([f"its connection had taken {', '.join(had)}"] if had else []) + others
    return (f"delivery {n} of {len(DELIVERIES)}: document {doc_id} to worker "
            f"{worker}" + (f" ({'; '.join(ctx)})" if ctx else ""))


def reused_consumers(bench, shift: int | None = None) -> dict:
    """Two consumers, each a long-running worker with one connection kept
    across its deliveries, take jobs in turn, the same document to both (a
    redelivery after a lease ran out); after each delivery every document
    taken so far must be summarized exactly once. `shift`: the documents'
    offset (a run's own, else)."""
    shift = shift or offset()
    deliveries = [(w, d + shift) for w, d in DELIVERIES]
    try:
        pair = hosts(bench.target, bench.module, "your outbox module", 2)
    except Unrunnable as err:
        return {"error": str(err)}
    workers = {w: (host, database(bench.target))
               for w, host in zip("AB", pair, strict=True)}
    db = bench.fresh()
    try:
        for doc_id in sorted({d for _, d in deliveries}):
            db.run("INSERT INTO documents (id, body) VALUES (?, ?)",
                   (doc_id, f"document {doc_id}"))
        seen: list = []
        for n, (worker, doc_id) in enumerate(deliveries, 1):
            host, ldb = workers[worker]
            host.summarize(ldb, doc_id)
            if untrusted := db.plain_tables(outbox.TABLES):
                return {"error": str(trusted_read.Untrusted(untrusted))}
            wrong = [(d, c) for d, c in _counts(db, {x for _, x in seen} | {doc_id})
                     if c != 1]
            if wrong:
                d, c = wrong[0]
                return {"kills": {"summarize": n - 1}, "failed": {
                    "function": "summarize", "round_trip": n,
                    "schedule": f"{_delivery(n, worker, doc_id, seen)}: "
                                f"document {d} was summarized {c} times",
                    "fix": FIX_REUSED}}
            seen.append((worker, doc_id))
        return {"kills": {"summarize": len(DELIVERIES)}, "failed": None}
    except (remote_module.LearnerError, remote_module.LearnerProcessDied) as err:
        return {"error": f"summarize: {type(err).__name__}: {err}"}
    finally:
        db.close()
        for host in pair:
            host.close()


def _counts(db: Database, docs: set[int]) -> list[tuple[int, int]]:
    """(document, summaries) for each document, in order."""
    rows = dict(db.query("SELECT doc_id, count(*) FROM summaries GROUP BY doc_id"))
    return [(d, rows.get(d, 0)) for d in sorted(docs)]
