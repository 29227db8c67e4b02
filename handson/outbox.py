"""Saving a document and queueing its job: two steps, or one transaction and a relay.

The save handler writes a `documents` row and must get a "summarize" job onto
the queue. Three ways, each a `SAVE_MODES` entry:

- `commit-then-enqueue`: commit the document, then enqueue. A crash between
  leaves a document whose job never exists.
- `enqueue-then-commit`: the other order. A crash between leaves a job for a
  document that was never saved.
- `outbox`: the document and an `outbox` row in ONE transaction; a separate
  relay publishes outbox rows to the queue and marks them sent. A crash
  anywhere leaves both or neither, and the relay catches up.

The relay publishes, then marks the row sent. Killed between the two, it
publishes that row again when it restarts: at-least-once, so the consumer
keeps a key (`summarized`) in the same transaction as its effect.

Two polling relay loops are here. `flag` selects `sent = 0` and is the one to
use. `high-water` remembers the largest id it published and asks for `id >
last`; it skips any row whose id was taken before a row with a larger id
committed (see `handson.outbox_runs.out_of_order`). A third, `wal`, polls
nothing: it reads committed inserts from PostgreSQL's log (`handson.wal_relay`);
`wal-confirm-first` is that relay confirming before it enqueues, which loses jobs.

As processes (what `handson.outbox_runs` starts and kills):

    python -m handson.outbox save --db T --redis URL --mode outbox --docs 0 100
    python -m handson.outbox relay --db T --redis URL [--loop flag]
    python -m handson.outbox consume --db T --redis URL

Each makes the tables if they are missing. `--module myoutbox.py` runs a
learner's `save_document`, `relay_once` and `summarize` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import redis

from handson.effects.sqldb import Database, is_postgres
from handson.infra import learner_module, remote_module
from handson.infra.worker_process import stop_at
from handson.queues.contract import load_queue

SAVE_MODES = ("commit-then-enqueue", "enqueue-then-commit", "outbox")
RELAY_LOOPS = ("flag", "high-water")
# the relay reading PostgreSQL's log, and the same relay confirming too early
WAL_LOOPS = ("wal", "wal-confirm-first")
TABLES = ("documents", "outbox", "outbox_seq", "relay_state", "summarized",
          "summaries", "inbox")

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS documents (id BIGINT PRIMARY KEY, body TEXT)",
    """CREATE TABLE IF NOT EXISTS outbox (
         id {id_pk}, doc_id BIGINT NOT NULL, sent INTEGER NOT NULL DEFAULT 0)""",
    # ids handed out before the row commits, as a PostgreSQL sequence does
    "CREATE TABLE IF NOT EXISTS outbox_seq (n BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS relay_state (last_id BIGINT NOT NULL)",
    # the consumer's key and its effect log (one row per effect applied)
    "CREATE TABLE IF NOT EXISTS summarized (doc_id BIGINT PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS summaries (n {id_pk}, doc_id BIGINT NOT NULL)",
    # the inbox: one row per message taken in, committed with its effect
    "CREATE TABLE IF NOT EXISTS inbox (message_id BIGINT PRIMARY KEY)",
]

Pause = Callable[..., None]


def _no_pause(point: str, n: int | None = None) -> None:
    return None


def setup(db: Database, fresh: bool = False) -> None:
    if fresh:
        db.drop(*TABLES)
    for statement in SCHEMA:
        db.run(statement.format(id_pk=db.id_pk))
    if not db.query("SELECT n FROM outbox_seq"):
        db.run("INSERT INTO outbox_seq (n) VALUES (0)")
    if not db.query("SELECT last_id FROM relay_state"):
        db.run("INSERT INTO relay_state (last_id) VALUES (0)")


# --- the save handler -----------------------------------------------------------

def save(db: Database, r: redis.Redis, queue, doc_id: int, body: str, mode: str,
         pause: Pause = _no_pause) -> None:
    """Save one document and see that its job reaches the queue, per `mode`."""
    job = {"doc_id": doc_id}
    if mode == "commit-then-enqueue":
        db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
        pause("between", doc_id)
        queue.enqueue(r, job)
    elif mode == "enqueue-then-commit":
        queue.enqueue(r, job)
        pause("between", doc_id)
        db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
    elif mode == "outbox":
        with db.transaction():
            db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
            pause("between", doc_id)
            db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))
    else:
        raise ValueError(f"unknown save mode {mode!r}; choose from "
                         f"{', '.join(SAVE_MODES)}")


def next_outbox_id(db: Database) -> int:
    """An outbox id taken now, committed at once, used by a later transaction.

    This is what a PostgreSQL sequence (or MySQL's auto-increment) does: the
    number is never given back and never waits for the transaction that uses
    it. SQLite's own rowids cannot show the skip, because SQLite lets one
    writer at a time insert and commit, so its ids commit in order.
    """
    return db.query("UPDATE outbox_seq SET n = n + 1 RETURNING n")[0][0]


def save_with_id(db: Database, outbox_id: int, doc_id: int, body: str) -> None:
    """The outbox save, with an id taken earlier by `next_outbox_id`."""
    with db.transaction():
        db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
        db.run("INSERT INTO outbox (id, doc_id) VALUES (?, ?)", (outbox_id, doc_id))


# --- the relay ------------------------------------------------------------------

def relay_batch(db: Database, r: redis.Redis, queue, loop: str = "flag",
                batch: int = 100, pause: Pause = _no_pause) -> int:
    """Publish one batch of outbox rows; return how many were published."""
    if loop in WAL_LOOPS:
        from handson import wal_relay

        return wal_relay.relay_batch(db, r, queue, batch, pause,
                                     confirm_first=loop == "wal-confirm-first")
    if loop == "flag":
        rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 "
                        "ORDER BY id LIMIT ?", (batch,))
    elif loop == "high-water":
        (last,) = db.query("SELECT last_id FROM relay_state")[0]
        rows = db.query("SELECT id, doc_id FROM outbox WHERE id > ? "
                        "ORDER BY id LIMIT ?", (last, batch))
    else:
        raise ValueError(f"unknown relay loop {loop!r}; choose from "
                         f"{', '.join(RELAY_LOOPS)}")
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)     # published, not yet marked
        if loop == "flag":
            db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
        else:
            db.run("UPDATE relay_state SET last_id = ?", (outbox_id,))
    return len(rows)


def relay_until_empty(db, r, queue, loop="flag", batch=100, pause=_no_pause) -> int:
    return _until_zero(lambda: relay_batch(db, r, queue, loop, batch, pause))


def unsent(db: Database) -> int:
    return db.query("SELECT count(*) FROM outbox WHERE sent = 0")[0][0]


# --- the consumer ---------------------------------------------------------------

def summarize(db: Database, doc_id: int, keyed: bool = True) -> bool:
    """The job's effect. Keyed: the key and the effect commit together, once."""
    with db.transaction():
        if keyed and not db.query("INSERT INTO summarized (doc_id) VALUES (?) "
                                  "ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                                  (doc_id,)):
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True


def receive(db: Database, message_id: int, doc_id: int,
            pause: Pause = _no_pause) -> bool:
    """The inbox: the message's id and its effect commit together, so a
    message delivered again finds its id taken and changes nothing. Unlike the
    key on `doc_id`, two messages about one document are two effects."""
    with db.transaction():
        if not db.query("INSERT INTO inbox (message_id) VALUES (?) ON CONFLICT "
                        "(message_id) DO NOTHING RETURNING message_id",
                        (message_id,)):
            return False
        pause("inside", message_id)     # taken in, effect not yet written
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True


def consume_all(db: Database, r: redis.Redis, queue, keyed: bool = True,
                lease_s: float = 30.0, limit: int = 1_000_000,
                apply: Callable | None = None, inbox: bool = False,
                pause: Pause = _no_pause) -> list[int]:
    """Work the queue until it is empty; the doc_id of every delivery, in order.

    `apply(db, doc_id)` is the effect; by default `summarize` (with or without
    its key). `inbox`: the effect is `receive`, keyed on the outbox row's id."""
    apply = apply or (lambda db, doc_id: summarize(db, doc_id, keyed))
    delivered = []
    for _ in range(limit):
        job = queue.claim(r, lease_s)
        if job is None:
            return delivered
        job_id, payload, attempt = job
        delivered.append(int(payload["doc_id"]))
        if inbox:
            receive(db, int(payload["outbox_id"]), int(payload["doc_id"]), pause)
        else:
            apply(db, int(payload["doc_id"]))
        queue.ack(r, job_id, attempt)
    raise RuntimeError(f"queue not empty after {limit} deliveries")


def effects(db: Database) -> tuple[int, int]:
    """(effects applied, distinct documents they were applied to)."""
    return db.query("SELECT count(*), count(DISTINCT doc_id) FROM summaries")[0]


def documents(db: Database) -> set[int]:
    return {d for (d,) in db.query("SELECT id FROM documents")}


# --- the processes --------------------------------------------------------------

# What a learner's module defines to stand in for this one (assignment: the
# outbox relay). The tables are the ones `setup` makes.
LEARNER_FUNCTIONS = {"save": "save_document", "relay": "relay_once",
                     "consume": "summarize"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the save handler, relay or consumer")
    p.add_argument("role", choices=("save", "relay", "consume"))
    p.add_argument("--db", required=True, help="SQLite file or PostgreSQL URL")
    p.add_argument("--redis", required=True, help="redis:// or unix:// URL")
    p.add_argument("--queue", default="handson.q", help="module or file path")
    p.add_argument("--module", help="a learner's module with save_document(db, "
                   "doc_id, body, pause), relay_once(db, r, queue, pause) and "
                   "summarize(db, doc_id), run instead of this one")
    p.add_argument("--mode", choices=SAVE_MODES, default="outbox")
    p.add_argument("--docs", nargs=2, type=int, metavar=("FIRST", "END"),
                   help="save documents FIRST .. END-1")
    p.add_argument("--loop", choices=(*RELAY_LOOPS, *WAL_LOOPS), default="flag")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--once", action="store_true", help="relay: one batch only")
    p.add_argument("--unkeyed", action="store_true", help="consume without a key")
    p.add_argument("--inbox", action="store_true",
                   help="consume through the inbox (keyed on the message id)")
    p.add_argument("--pause-at", help="the named point: between (save: the "
                   "document and its job; relay: publish and mark, or confirm and "
                   "publish for wal-confirm-first), inside "
                   "(consume --inbox: message taken in, effect not written)")
    p.add_argument("--pause-n", type=int, help="the document / outbox id to stop at")
    p.add_argument("--limit-s", type=float, default=30.0)
    a = p.parse_args(argv)
    if a.role == "save" and not a.docs:
        p.error("save needs --docs FIRST END")
    try:
        learner = a.module and remote_module.load_learner(
            a.module, (LEARNER_FUNCTIONS[a.role],), "your outbox module")
    except learner_module.ModuleProblem as err:
        print(json.dumps({"error": str(err)}), flush=True)
        return 2
    queue = load_queue(a.queue)
    r = redis.Redis.from_url(a.redis)
    pause = stop_at(a.pause_at, a.pause_n, a.limit_s)
    with Database(a.db) as db:
        setup(db)
        mine = (db, r, queue, pause)            # what the learner's code gets
        if isinstance(learner, remote_module.RemoteModule):
            mine = _stand_ins(a, pause)
        ldb, lr, lqueue, lpause = mine
        if a.role == "save":
            for doc_id in range(*a.docs):
                body = f"document {doc_id}"
                if learner:
                    learner.save_document(ldb, doc_id, body, lpause)
                else:
                    save(db, r, queue, doc_id, body, a.mode, pause)
            result = {"saved": a.docs[1] - a.docs[0]}
        elif a.role == "relay":
            if learner:
                def one():
                    return learner.relay_once(ldb, lr, lqueue, lpause) or 0
            else:
                def one():
                    return relay_batch(db, r, queue, a.loop, a.batch, pause)
            published = one() if a.once else _until_zero(one)
            result = {"published": published}
        else:
            apply = learner and (lambda db, doc_id: learner.summarize(ldb, doc_id))
            result = {"delivered": consume_all(db, r, queue, not a.unkeyed,
                                               apply=apply, inbox=a.inbox,
                                               pause=pause)}
    print(json.dumps({**result, "pid": os.getpid()}), flush=True)
    return 0


def _stand_ins(a, pause: Pause) -> tuple:
    """What a hosted learner module gets in place of db, r, queue and pause.

    Its host opens the same database and Redis itself and imports the course's
    queue by name; the pause stays here, called back over the pipe, so the
    announcement the harness kills on comes from this process, never from the
    learner's.
    """
    target = a.db if is_postgres(a.db) else os.path.abspath(a.db)
    return (remote_module.Local("course_object", module=Database.__module__,
                                name=Database.__name__, args=[target]),
            remote_module.Local("redis", url=a.redis),
            remote_module.Local("course_module", name=a.queue),
            remote_module.Caller(pause, name="pause"))


def _until_zero(one: Callable[[], int], max_batches: int = 100_000) -> int:
    total = 0
    for _ in range(max_batches):
        n = one()
        total += n
        if n == 0:
            return total
    raise RuntimeError(f"relay still busy after {max_batches} batches")


if __name__ == "__main__":
    sys.exit(main())
