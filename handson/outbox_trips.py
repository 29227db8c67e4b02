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
WAITING = {2: 0, 4: 1}          # outbox id: document, committed before the call
RACING = {3: 2, 1: 3, 5: 4}     # committed while relay_once is stopped, in order
RACE = ("meanwhile writers committed outbox row 3, then row 1 (ids taken "
        "before row 4 committed, so lower than rows it may have published) and "
        "row 5; then relay_once went on, ran again until it returned 0, and a "
        "consumer took every job")
FIX_RACE = ("mark sent (or delete) exactly the rows this call read and "
            "published, by their ids (`WHERE id = ?` per row, or `WHERE id IN "
            "(...)`): a row a writer commits while the relay runs, whatever its "
            "id, is one the relay never read, and must stay unsent for the next "
            "relay_once")


def _race(target: str, committed: list[int]):
    """The writers, in a connection of our own with a short busy timeout: the
    documents they committed, or LOCKED if the stopped relay holds the write
    lock (no writer can commit inside that call)."""
    def write():
        try:
            with Database(target, RIVAL_WAIT_S) as db:
                for outbox_id, doc_id in RACING.items():
                    outbox.save_with_id(db, outbox_id, doc_id, f"document {doc_id}")
                    committed.append(doc_id)
        except sqlite3.OperationalError as err:
            if "locked" not in str(err):
                return err
            return list(committed) if committed else LOCKED
        return list(committed)
    return write


def writers_race_relay(bench) -> dict:
    """relay_once stopped after each of its round trips while writers commit
    outbox rows, lower ids than ones it read among them, out of id order; the
    relay then goes on and runs again: every committed document delivered."""
    try:
        [learner] = hosts(bench.target, bench.module, "your outbox module")
    except Unrunnable as err:
        return {"error": str(err)}
    a = SimpleNamespace(db=bench.target, redis=bench.redis_url,
                        queue=bench.queue_spec)
    ldb, lr, lqueue, lpause = outbox._stand_ins(a, outbox._no_pause)
    committed: list[int] = []

    def waiting(db: Database) -> None:
        committed.clear()
        for outbox_id, doc_id in WAITING.items():
            outbox.save_with_id(db, outbox_id, doc_id, f"document {doc_id}")

    def relay_again(db: Database) -> str:
        outbox._until_zero(lambda: learner.relay_once(ldb, lr, lqueue, lpause)
                           or 0, max_batches=50)
        got = set(outbox.consume_all(db, bench.r, bench.queue))
        row = {d: i for i, d in (*WAITING.items(), *RACING.items())}
        lost = [d for d in [*WAITING.values(), *committed] if d not in got]
        if not lost:
            return ""
        when = ("committed while relay_once was stopped" if lost[0] in committed
                else "waiting before the call")
        return (f"document {lost[0]} (outbox row {row[lost[0]]}, {when}) was "
                "never delivered")

    scene = Scene("relay_once", waiting,
                  lambda: learner.relay_once(ldb, lr, lqueue, lpause),
                  relay_again, RACE, FIX_RACE,
                  rival=_race(bench.target, committed))
    try:
        return run_scenes(Stores(bench.fresh, outbox.TABLES, bench.redis_url),
                          learner, [scene], each=each_stop)
    finally:
        learner.close()


# --- long-running consumers -------------------------------------------------------

# (worker, document): each worker one host and one connection, kept across its
# deliveries; document 1 comes again to A after B applied it, 0 to B after A.
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


def reused_consumers(bench) -> dict:
    """Two consumers, each a long-running worker with one connection kept
    across its deliveries, take jobs in turn, the same document to both (a
    redelivery after a lease ran out); after each delivery every document
    taken so far must be summarized exactly once."""
    try:
        pair = hosts(bench.target, bench.module, "your outbox module", 2)
    except Unrunnable as err:
        return {"error": str(err)}
    workers = {w: (host, database(bench.target))
               for w, host in zip("AB", pair, strict=True)}
    db = bench.fresh()
    try:
        for doc_id in {d for _, d in DELIVERIES}:
            db.run("INSERT INTO documents (id, body) VALUES (?, ?)",
                   (doc_id, f"document {doc_id}"))
        seen: list = []
        for n, (worker, doc_id) in enumerate(DELIVERIES, 1):
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
