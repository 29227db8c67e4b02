"""The outbox measured: save handlers and relays killed with SIGKILL, then counted.

Three experiments, each from empty tables and an empty queue:

- `dual_write`: a save handler process saves N documents and is killed at the
  named point between its two steps on K seeded documents, restarted each time
  with the next document. Then the relay (for the outbox) and a consumer run,
  and we count documents without a job and jobs without a document.
- `relay_kills`: N documents saved through the outbox; the relay process is
  killed between publishing a row and marking it sent, K times. We count the
  deliveries and the effects the consumer applied, with and without its key.
- `out_of_order`: W writers take outbox ids in order and commit in a seeded
  shuffled order while the relay polls after every commit. The high-water
  relay skips rows; the sent-flag relay does not.
- `slot_retention` (PostgreSQL): what a replication slot that nobody confirms
  keeps of the WAL while documents are saved, and what a confirm gives back.
- `unflushed_commit` (PostgreSQL): the log relay peeks while a committed row is
  written to the WAL but not yet flushed, and confirms after it is: a relay
  that takes the write position for the end of the log skips that row for
  good; one that confirms only what its peek read (the flush position) does not.

The relay experiments take `loop="wal"` too: the relay that reads the log;
`relay_kills` also takes `loop="wal-confirm-first"`, the same relay confirming
each transaction before its enqueue, killed between the two: it loses a job
per kill instead of delivering one twice.

    python -m handson.outbox_runs          # all three tables, SQLite + a private Redis
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import redis

from handson import outbox, outbox_trips, round_trips, wal_relay
from handson.effects.sqldb import Database, default_target
from handson.infra import learner_module, remote_module
from handson.infra.worker_process import WorkerError, run_or_kill
from handson.queues.contract import load_queue

MODULE = "handson.outbox"


@dataclass
class SaveRun:
    mode: str
    saves: int
    kills: int
    documents: int
    jobs: int
    documents_without_job: int
    jobs_without_document: int


@dataclass
class RelayRun:
    consumer: str
    documents: int
    relay_kills: int
    deliveries: int
    duplicate_deliveries: int
    effects: int
    duplicate_effects: int
    lost: int


@dataclass
class OrderRun:
    loop: str
    writers: int
    commit_order: list[int]
    published: int
    skipped: int


class Bench:
    """The database target, the Redis URL and the queue, emptied for each run.

    `own_redis`: the Redis database is this bench's alone, so each run starts
    by emptying it (FLUSHDB). Draining the queue is not enough: a queue that
    remembers finished job ids would skip a relay's idempotent publishes of
    the fresh tables' row ids, and one run would change the next one's score.
    """

    def __init__(self, target: str, redis_url: str, queue: str = "handson.q",
                 timeout_s: float = 30.0, module: str | None = None,
                 own_redis: bool = False):
        self.target, self.redis_url, self.queue_spec = target, redis_url, queue
        self.own_redis = own_redis
        self.queue = load_queue(queue)
        self.r = redis.Redis.from_url(redis_url)
        self.timeout_s = timeout_s
        # a learner's module: its save, relay and consumer run, each in its
        # own process; None: the reference, with the relay and consumer in-process
        self.module = module

    def fresh(self) -> Database:
        db = Database(self.target)
        outbox.setup(db, fresh=True)
        if self.own_redis:
            self.r.flushdb()
        outbox.consume_all(db, self.r, self.queue)      # empty the queue
        outbox.setup(db, fresh=True)
        return db

    def drain(self, db: Database, keyed: bool = True, inbox: bool = False
              ) -> list[int]:
        """Every job left in the queue, consumed and acked: the doc ids."""
        if self.module:
            return self.process("consume", [], None)["delivered"]
        return outbox.consume_all(db, self.r, self.queue, keyed, inbox=inbox)

    @contextlib.contextmanager
    def poller(self, db: Database, loop: str):
        """A function that runs one relay batch and says how many rows it
        published. A learner's relay is one host for the whole experiment, its
        connection and its module's state kept between polls, as a relay
        service runs: a relay that remembers in memory what it published is
        judged as it would run."""
        if not self.module:
            yield lambda: outbox.relay_batch(db, self.r, self.queue, loop)
            return
        try:
            host = round_trips.hosted(self.module, "your outbox module")
        except learner_module.ModuleProblem as err:
            raise WorkerError(f"relay: {err}") from None
        kit = outbox._stand_ins(SimpleNamespace(db=self.target, redis=self.redis_url,
                                                queue=self.queue_spec),
                                outbox._no_pause)

        def poll() -> int:
            try:
                return int(host.relay_once(*kit) or 0)
            except (remote_module.LearnerError,
                    remote_module.LearnerProcessDied) as err:
                raise WorkerError(f"relay: {type(err).__name__}: {err}") from None
        try:
            yield poll
        finally:
            host.close()

    def process(self, role: str, extra: list[str], kill_at: int | None,
                point: str = "between") -> dict | None:
        """Run the save handler, relay or consumer; SIGKILL it at its named
        point for item `kill_at` if given. Its JSON result, or None if killed."""
        args = [role, "--db", self.target, "--redis", self.redis_url, "--queue",
                self.queue_spec, "--limit-s", repr(self.timeout_s), *extra]
        if self.module:
            args += ["--module", self.module]
        if kill_at is not None:
            args += ["--pause-at", point, "--pause-n", str(kill_at)]
        stop = f"{point} {kill_at}" if kill_at is not None else None
        result = run_or_kill(MODULE, args, stop, self.timeout_s)
        if result is not None and "error" in result:
            raise WorkerError(f"{role}: {result['error']}")
        return result

    def close(self) -> None:
        self.r.close()


def kill_points(n: int, kills: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(1, n), kills))


def dual_write(bench: Bench, mode: str, docs: int = 100, kills: int = 3,
               seed: int = 7) -> SaveRun:
    db = bench.fresh()
    try:
        start = 0
        for k in [*kill_points(docs, kills, seed), None]:
            args = ["--mode", mode, "--docs", str(start), str(docs)]
            bench.process("save", args, k)
            start = k + 1 if k is not None else docs
        if mode == "outbox":
            bench.process("relay", [], None)
        jobs = bench.drain(db)
        saved = outbox.documents(db)
        return SaveRun(mode, docs, kills, len(saved), len(jobs),
                       len(saved - set(jobs)), len(set(jobs) - saved))
    finally:
        db.close()


def relay_kills(bench: Bench, keyed: bool, docs: int = 100, kills: int = 3,
                seed: int = 11, loop: str = "flag", inbox: bool = False
                ) -> RelayRun:
    db = bench.fresh()
    if loop in outbox.WAL_LOOPS:
        wal_relay.fresh_slot(db)
    try:
        for doc_id in range(docs):
            outbox.save(db, bench.r, bench.queue, doc_id, f"document {doc_id}",
                        "outbox")
        ids = sorted(i for (i,) in db.query("SELECT id FROM outbox"))
        for k in [*(ids[i] for i in kill_points(docs, kills, seed)), None]:
            bench.process("relay", ["--loop", loop], k)
        delivered = bench.drain(db, keyed, inbox)
        applied, distinct = outbox.effects(db)
        consumer = ("with an inbox" if inbox else "with its key" if keyed
                    else "without a key")
        return RelayRun(consumer, docs, kills,
                        len(delivered), len(delivered) - len(set(delivered)),
                        applied, applied - distinct, docs - len(set(delivered)))
    finally:
        if loop in outbox.WAL_LOOPS:
            wal_relay.drop_slot(db)
        db.close()


def check_saves(saves: list[SaveRun], kills: int) -> None:
    """The chapter's claim: each kill leaves a document without its job (two
    steps) or a job without its document (swapped); the outbox leaves neither."""
    two, swapped, box = ({s.mode: s for s in saves}[m] for m in outbox.SAVE_MODES)
    if not (two.documents_without_job == kills
            and swapped.jobs_without_document == kills):
        raise AssertionError(f"each of {kills} kills must orphan one: {two}, "
                             f"{swapped}")
    if box.documents_without_job or box.jobs_without_document:
        raise AssertionError(f"the outbox must keep documents and jobs together: "
                             f"{box}")


def check_relays(relays: list[RelayRun], kills: int) -> None:
    """The chapter's claim: a relay killed between publish and mark delivers a
    job twice per kill and loses none; the key makes the effect once."""
    naive, keyed = relays
    if not (keyed.duplicate_deliveries == kills and keyed.duplicate_effects == 0):
        raise AssertionError(f"{kills} kills: one extra delivery each, no extra "
                             f"effect with the key: {keyed}")
    if not naive.duplicate_deliveries == naive.duplicate_effects == kills:
        raise AssertionError(f"without the key the consumer applies each of the "
                             f"{kills} extra deliveries again: {naive}")
    if keyed.lost or naive.lost:
        raise AssertionError(f"a relay that publishes first loses nothing: "
                             f"{naive}, {keyed}")


def check_orders(orders: list[OrderRun]) -> None:
    """The chapter's claim: commits out of id order hide rows below the
    high-water mark, and the relay that selects unsent rows publishes them all."""
    flag, hwm = ({o.loop: o for o in orders}[lp] for lp in outbox.RELAY_LOOPS)
    if not hwm.skipped:
        raise AssertionError(f"the high-water relay must skip a row committed "
                             f"below its mark: {hwm}")
    if flag.skipped:
        raise AssertionError(f"the relay that selects unsent rows must skip "
                             f"none: {flag}")


def doubled_deliveries(bench: Bench, docs: int = 20) -> RelayRun:
    """Every document's job delivered twice on purpose: the consumer's key alone
    decides how many effects there are."""
    db = bench.fresh()
    try:
        for doc_id in range(docs):
            db.run("INSERT INTO documents (id, body) VALUES (?, ?)",
                   (doc_id, f"document {doc_id}"))
            for _ in range(2):
                bench.queue.enqueue(bench.r, {"doc_id": doc_id})
        delivered = bench.drain(db)
        applied, distinct = outbox.effects(db)
        return RelayRun("learner" if bench.module else "with its key", docs, 0,
                        len(delivered), len(delivered) - len(set(delivered)),
                        applied, applied - distinct, docs - distinct)
    finally:
        db.close()


def observe_all(bench: Bench, docs: int = 40, kills: int = 3) -> dict:
    """The experiments on a module, as plain data (for a grader); a learner's
    module also killed after each of its functions' round trips
    (`handson.outbox_trips`)."""
    runs = {
        "save_killed": lambda: dual_write(bench, "outbox", docs, kills),
        "relay_killed": lambda: relay_kills(bench, True, docs, kills),
        "doubled_deliveries": lambda: doubled_deliveries(bench),
        "out_of_order": lambda: out_of_order(bench, "flag"),
    }
    if bench.module:        # a host of ours, killed after each round trip
        runs["round_trips"] = lambda: outbox_trips.killed_between_trips(bench)
        runs["interleaved"] = lambda: outbox_trips.interleaved_consumers(bench)
        runs["writers_race"] = lambda: outbox_trips.writers_race_relay(bench)
        runs["reused"] = lambda: outbox_trips.reused_consumers(bench)
    out = {}
    for name, run in runs.items():
        try:
            got = run()
            out[name] = got if isinstance(got, dict) else asdict(got)
        except (WorkerError, OSError) as err:
            out[name] = {"error": str(err)}
    return out


def _commit_and_poll(bench: Bench, db: Database, loop: str, commits: list,
                     commit_order: list[int]) -> OrderRun:
    """Run each commit, let the relay poll after each, then count what got out."""
    with bench.poller(db, loop) as poll:
        for commit in commits:
            commit()
            poll()
        for _ in range(len(commits) + 1):     # then poll until a poll finds nothing
            if poll() == 0:
                break
    published = bench.drain(db)
    return OrderRun(loop, len(commits), commit_order, len(published),
                    len(commits) - len(set(published)))


def out_of_order(bench: Bench, loop: str, writers: int = 8, seed: int = 3
                 ) -> OrderRun:
    """Ids taken in order 1..W (shifted, for a learner's module), commits in a
    shuffled order, a poll after each."""
    db = bench.fresh()
    conns = [Database(bench.target) for _ in range(writers)]
    # a learner's relay sees ids and documents shifted by the run's own offsets
    first, doc = ((outbox_trips.offset(), outbox_trips.offset()) if bench.module
                  else (0, 0))
    try:
        db.run("UPDATE outbox_seq SET n = ?", (first,))
        ids = [outbox.next_outbox_id(c) for c in conns]
        order = list(range(writers))
        random.Random(seed).shuffle(order)
        commits = [lambda i=i: _save(conns[i], ids[i], doc + i) for i in order]
        return _commit_and_poll(bench, db, loop, commits, [ids[i] for i in order])
    finally:
        for c in conns:
            c.close()
        db.close()


def _save(db: Database, outbox_id: int, doc_id: int) -> None:
    """A writer's commit; WorkerError if what the module left stops it."""
    try:
        outbox.save_with_id(db, outbox_id, doc_id, f"document {doc_id}")
    except sqlite3.Error as err:
        raise WorkerError(outbox_trips.writer_failed(db, outbox_id, doc_id, err)
                          ) from None


def out_of_order_natural(bench: Bench, loop: str, writers: int = 8, seed: int = 3
                         ) -> OrderRun:
    """PostgreSQL only: W open transactions insert in order (ids from the
    table's own identity) and commit shuffled. No id is taken by hand."""
    db = bench.fresh()
    if db.dialect != "postgres":
        db.close()
        raise ValueError("SQLite lets one transaction write at a time, so the "
                         "second insert would wait for the first commit; use "
                         "out_of_order() there")
    if loop in outbox.WAL_LOOPS:
        wal_relay.fresh_slot(db)        # before the writers' transactions begin
    conns = [Database(bench.target) for _ in range(writers)]
    try:
        txs, ids = [], []
        for i, c in enumerate(conns):   # all W transactions open at once
            tx = c.transaction()
            tx.__enter__()
            txs.append(tx)
            c.run("INSERT INTO documents (id, body) VALUES (?, ?)",
                  (i, f"document {i}"))
            ids.append(c.query("INSERT INTO outbox (doc_id) VALUES (?) "
                               "RETURNING id", (i,))[0][0])
        order = list(range(writers))
        random.Random(seed).shuffle(order)
        commits = [lambda i=i: txs[i].__exit__(None, None, None) for i in order]
        return _commit_and_poll(bench, db, loop, commits, [ids[i] for i in order])
    finally:
        for c in conns:
            c.close()
        if loop in outbox.WAL_LOOPS:
            wal_relay.drop_slot(db)
        db.close()


@dataclass
class Retention:
    saved: list[int]            # documents saved so far, at each measurement
    retained: list[int]         # WAL bytes the unconfirmed slot kept, then
    after_confirm: int          # ... once the relay had published and confirmed
    published: int


def slot_retention(bench: Bench, steps: tuple[int, ...] = (0, 200, 400, 800)
                   ) -> Retention:
    """Save documents with no relay running: the slot keeps their WAL. Then one
    relay run publishes everything and confirms, and the slot lets it go."""
    db = bench.fresh()
    wal_relay.fresh_slot(db)
    try:
        retained, done = [], 0
        for n in steps:
            for doc_id in range(done, n):
                outbox.save(db, bench.r, bench.queue, doc_id, f"document {doc_id}",
                            "outbox")
            done = n
            retained.append(wal_relay.retained_wal(db))
        published = outbox.relay_until_empty(db, bench.r, bench.queue, "wal")
        db.run("CHECKPOINT")         # lets the slot's restart point move on
        wal_relay.relay_batch(db, bench.r, bench.queue)
        return Retention(list(steps), retained, wal_relay.retained_wal(db),
                         published)
    finally:
        wal_relay.drop_slot(db)
        db.close()


class CannotPause(RuntimeError):
    """The server's WAL writer is not a process this machine can pause."""


@contextlib.contextmanager
def walwriter_paused(db: Database):
    """The server's WAL writer stopped (SIGSTOP) for the block, then resumed.

    Under `synchronous_commit = off` a commit returns before its WAL is
    flushed, and the WAL writer flushes it a moment later (at once, if it was
    idle). Paused, it flushes nothing, so the commit stays unflushed until a
    synchronous commit flushes the log itself. Only for a server running on
    this machine as a user we may signal (the course's throwaway cluster)."""
    pid = db.query("SELECT pid FROM pg_stat_activity "
                   "WHERE backend_type = 'walwriter'")[0][0]
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            title = f.read()
    except OSError:
        title = b""
    if not title.startswith(b"postgres: walwriter"):
        raise CannotPause(f"process {pid} on this machine is not the server's "
                          "WAL writer (a server elsewhere?)")
    try:
        os.kill(pid, signal.SIGSTOP)
    except PermissionError as err:
        raise CannotPause(f"may not signal the WAL writer: {err}") from None
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def written(db: Database) -> str:
    """The WAL write position, `pg_current_wal_lsn()`: where the log relay
    used to take the log to end, and confirm to when its peek found nothing.
    Here only to be measured against `wal_relay.flushed`."""
    return db.query("SELECT pg_current_wal_lsn()::text")[0][0]


class _CommitAfterPeek:
    """The relay's connection, with one more commit landing right after the
    relay's peek returns and before its confirm."""

    def __init__(self, db: Database, commit):
        self._db, self._commit, self.dialect = db, commit, db.dialect
        self.peeked: list = []

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        rows = self._db.query(sql, params)
        if "peek_changes" in sql and self._commit:
            self.peeked = rows
            commit, self._commit = self._commit, None
            commit()
        return rows


@dataclass
class GapRun:
    end_of_log: str             # where the relay took the log to end
    documents: int
    written_not_flushed_kib: int    # WAL written, not flushed, at its peek
    peeked: int                 # rows its peek returned (0: the gap was open)
    published: int
    lost: int


def unflushed_commit(bench: Bench, end_of_log=None) -> GapRun:
    """PostgreSQL on this machine only: a commit written to the WAL but not yet
    flushed when the relay peeks, and flushed before it confirms.

    With the WAL writer paused, document 0 commits under `synchronous_commit
    = off`: committed, its WAL still in the server's buffers. A bulk insert
    in another session (left open, then rolled back) writes more WAL than
    the buffers hold, so the server writes the older pages out, document 0's
    commit among them, without flushing them: the write position
    (`pg_current_wal_lsn()`) is now past that commit and the flush position
    is not, as on a server with fsync on while an fsync is under way. The
    relay takes the end of the log (`end_of_log`) and peeks, which reads only
    flushed WAL. Between its peek and its confirm, document 1 commits
    synchronously, and that flush takes document 0's commit to disk. Then
    the relay runs until it finds nothing, and a consumer drains the queue.

    Confirming the write position (`end_of_log=written`) moves the slot past
    document 0, which its peek never read: lost. The relay's own end of the
    log (None: `wal_relay.flushed`, read before the peek) loses nothing."""
    own = {} if end_of_log is None else {"end_of_log": end_of_log}
    db = bench.fresh()
    db.run("DROP TABLE IF EXISTS wal_filler")
    db.run("CREATE TABLE wal_filler (b text)")
    (buffers,) = db.query("SELECT pg_size_bytes(current_setting('wal_buffers'))"
                          )[0]
    wal_relay.fresh_slot(db)            # after the setup: nothing to read yet
    db.query("SELECT pg_switch_wal()")  # a fresh segment: finishing one flushes
    writer, bulk = Database(bench.target), Database(bench.target)
    try:
        writer.run("SET synchronous_commit = off")

        def second() -> None:
            writer.run("SET synchronous_commit = on")
            outbox.save(writer, bench.r, bench.queue, 1, "document 1", "outbox")

        gap = _CommitAfterPeek(db, second)
        with walwriter_paused(db):
            outbox.save(writer, bench.r, bench.queue, 0, "document 0", "outbox")
            bulk.run("BEGIN")
            bulk.run("INSERT INTO wal_filler SELECT repeat('x', 1000) "
                     "FROM generate_series(1, ?)", (int(buffers) * 3 // 2000,))
            (behind,) = db.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), "
                                 "pg_current_wal_flush_lsn())")[0]
            published = wal_relay.relay_batch(gap, bench.r, bench.queue, **own)
        bulk.run("ROLLBACK")
        published += outbox.relay_until_empty(db, bench.r, bench.queue, "wal")
        delivered = bench.drain(db)
        return GapRun(end_of_log.__name__ if end_of_log else "the relay's own",
                      2, int(behind) // 1024, len(gap.peeked),
                      published, 2 - len(set(delivered)))
    finally:
        writer.close()
        bulk.close()
        wal_relay.drop_slot(db)
        db.run("DROP TABLE IF EXISTS wal_filler")
        db.close()


@dataclass
class Lag:
    loop: str
    documents: int
    poll_s: float
    median_ms: float
    max_ms: float
    order_kept: bool            # jobs enqueued in the order the rows committed


class _Stamped:
    """The queue, with the time each outbox row's job was enqueued."""

    def __init__(self, queue):
        self.queue, self.at = queue, {}

    def enqueue(self, r, payload, job_id=None):
        self.at.setdefault(payload["outbox_id"], time.monotonic())
        return self.queue.enqueue(r, payload, job_id)


def lag(bench: Bench, loop: str, docs: int = 40, poll_s: float = 0.05,
        gap_s: float = 0.02) -> Lag:
    """A relay polling every poll_s while documents commit every gap_s: the
    time from each commit to its job's enqueue."""
    db = bench.fresh()
    if loop in outbox.WAL_LOOPS:
        wal_relay.fresh_slot(db)
    writer = Database(bench.target)
    stamped, stop = _Stamped(bench.queue), threading.Event()

    def relay() -> None:
        with Database(bench.target) as rdb:
            while not stop.is_set():
                outbox.relay_batch(rdb, bench.r, stamped, loop)
                stop.wait(poll_s)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    committed = {}
    try:
        for doc_id in range(docs):
            outbox.save(writer, bench.r, bench.queue, doc_id, f"document {doc_id}",
                        "outbox")
            committed[doc_id] = time.monotonic()
            time.sleep(gap_s)
        deadline = time.monotonic() + 30
        while len(stamped.at) < docs and time.monotonic() < deadline:
            time.sleep(poll_s)
    finally:
        stop.set()
        thread.join(timeout=30)
        if loop in outbox.WAL_LOOPS:
            wal_relay.drop_slot(db)
        writer.close()
    doc_of = dict(db.query("SELECT id, doc_id FROM outbox"))
    db.close()
    if len(stamped.at) < docs:
        raise AssertionError(f"the {loop} relay published {len(stamped.at)} of "
                             f"{docs} rows in 30 s")
    lags = sorted((t - committed[doc_of[i]]) * 1000 for i, t in stamped.at.items())
    by_time = [doc_of[i] for i, _ in sorted(stamped.at.items(), key=lambda x: x[1])]
    return Lag(loop, docs, poll_s, round(statistics.median(lags), 1),
               round(lags[-1], 1), by_time == sorted(by_time))


@dataclass
class InboxCase:
    case: str
    applied: bool               # did this delivery change anything
    effects: int                # effects in the database after it


def inbox_cases(bench: Bench) -> list[InboxCase]:
    """The replay matrix's cases for an effect in the database, through the
    inbox: again after success, two consumers at once, another message about
    the same document, a consumer killed inside its transaction, redelivered."""
    db = bench.fresh()
    out = []

    def note(case: str, applied: bool) -> None:
        out.append(InboxCase(case, applied, outbox.effects(db)[0]))

    try:
        note("first delivery of message 1 (document 1)", outbox.receive(db, 1, 1))
        note("message 1 again after success", outbox.receive(db, 1, 1))
        # message 2 to two consumers at once: the rival's insert waits on the
        # first one's uncommitted inbox row, then finds it taken
        answer = []

        def rival() -> None:
            with Database(bench.target) as other:
                answer.append(outbox.receive(other, 2, 2))

        with db.transaction():
            db.run("INSERT INTO inbox (message_id) VALUES (2)")
            db.run("INSERT INTO summaries (doc_id) VALUES (2)")
            racer = threading.Thread(target=rival)
            racer.start()
            racer.join(timeout=0.5)         # still waiting: the row is ours
        racer.join(timeout=30)
        if not answer:
            raise RuntimeError("the second consumer of message 2 never answered")
        note("message 2 to two consumers at once: the second", answer[0])
        note("message 3, another about document 1", outbox.receive(db, 3, 1))
        bench.queue.enqueue(bench.r, {"doc_id": 4, "outbox_id": 4})
        bench.process("consume", ["--inbox"], 4, point="inside")
        taken = db.query("SELECT count(*) FROM inbox WHERE message_id = 4")[0][0]
        note("message 4: consumer killed inside its transaction", bool(taken))
        note("message 4 redelivered", outbox.receive(db, 4, 4))
        return out
    finally:
        db.close()


def render(rows: list) -> str:
    """A plain table of dataclass rows (for the terminal)."""
    names = list(vars(rows[0]))
    cells = [[str(getattr(x, n)) for n in names] for x in rows]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = [[n.replace("_", " ") for n in names], *cells]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)
                               ).rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the outbox experiments")
    p.add_argument("--db", help="SQLite file or PostgreSQL URL (default: "
                   "DATABASE_URL, else a temporary SQLite file)")
    p.add_argument("--queue", default="handson.q")
    p.add_argument("--module", help="a learner's outbox module (.py) to run")
    p.add_argument("--json", action="store_true",
                   help="the experiments on --module as JSON, for the grader")
    a = p.parse_args(argv)
    from handson.redis_server import redis_url
    with tempfile.TemporaryDirectory(prefix="eo-outbox-") as tmp, \
            redis_url() as url:
        # --json is the grader's run, on a Redis it started for this run alone;
        # without REDIS_URL the server is our private one: both may be emptied
        own = a.json or not os.environ.get("REDIS_URL")
        bench = Bench(a.db or default_target(os.path.join(tmp, "app.sqlite")),
                      url, a.queue, module=a.module and os.path.abspath(a.module),
                      own_redis=own)
        if a.json:
            print(json.dumps(observe_all(bench)))
            bench.close()
            return 0
        print(render([dual_write(bench, m) for m in outbox.SAVE_MODES]), "\n")
        print(render([relay_kills(bench, k) for k in (False, True)]), "\n")
        print(render([out_of_order(bench, lp) for lp in outbox.RELAY_LOOPS]))
        bench.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
