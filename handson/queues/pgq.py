"""The queue inside PostgreSQL: jobs are rows, claimed with FOR UPDATE SKIP LOCKED.

The same contract as the Redis reference (`handson.q`) where it applies:

- `enqueue` is idempotent on `job_id` (the primary key): a known id, in any
  state, is the same job. `enqueue_tx` does it inside the caller's transaction,
  so the row that causes the job and the job commit together or not at all.
- `claim` takes the oldest pending row that no other transaction has locked
  (`SKIP LOCKED`: claimers never queue up behind each other), bumps its attempt
  (the fencing token) and sets its lease on the server's clock, in one UPDATE.
- `ack`, `extend` and `fail` name the attempt and touch the row only while it
  is still that attempt's, so a zombie is refused.
- `reap` moves expired leases back to pending, or to the dead-letter table
  `pgq_dead` with a reason once the job used `max_attempts` attempts.
- `finish` is what Redis cannot do: the job's effect (here the score, with no
  key that would make a second one harmless) and the ack are ONE transaction.
  If the ack is refused the effect rolls back; if the worker dies before the
  COMMIT, neither happened. So a job's effect happens once with no dedup key.

Past QUEUE_MAX pending jobs a new one raises QueueFull. Finished rows stay,
so an id is one job for as long as its row lives; a deployment deletes done
rows after a retention window (and vacuums: see the chapter's dead rows).

The first argument of every function is the contract's Redis client; this
queue ignores it and opens its own connection (one per thread, autocommit) to
`PGQ_URL`, or DATABASE_URL. Every time is the server's `clock_timestamp()`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import psycopg

from handson.infra import trusted_read
from handson.q import DEFAULT_MAX_PENDING, LEASE_EXPIRED, QueueFull

STATE_OUTSIDE_REDIS = True    # the contract checks call reset() first
REAP_LIMIT = 1000
TABLES = ("pgq_jobs", "pgq_dead", "pgq_scores", "pgq_stats", "pgq_applied")

SCHEMA = """
CREATE TABLE IF NOT EXISTS pgq_jobs (
  id text PRIMARY KEY,
  payload jsonb NOT NULL,
  state text NOT NULL DEFAULT 'pending',  -- pending, inflight, done, dead
  attempt int NOT NULL DEFAULT 0,         -- the fencing token: only grows
  budget_from int NOT NULL DEFAULT 0,     -- attempts when last redriven
  failed boolean NOT NULL DEFAULT false,
  last_error text,
  lease_until timestamptz,
  queued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS pgq_pending ON pgq_jobs (queued_at, id)
  WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS pgq_leases ON pgq_jobs (lease_until)
  WHERE state = 'inflight';
CREATE TABLE IF NOT EXISTS pgq_dead (
  id text PRIMARY KEY, attempts int NOT NULL, reason text NOT NULL,
  died_at timestamptz NOT NULL DEFAULT clock_timestamp());
-- the effect of `finish`: a plain INSERT, no key that would dedupe it
CREATE TABLE IF NOT EXISTS pgq_scores (job_id text, doc_id bigint, score real);
CREATE TABLE IF NOT EXISTS pgq_stats (n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS pgq_applied (
  job_id text, attempt int, pid int, t bigint);
"""

_local = threading.local()


def url() -> str:
    found = os.environ.get("PGQ_URL") or os.environ.get("DATABASE_URL")
    if not found:
        raise RuntimeError("set PGQ_URL (or DATABASE_URL) to the PostgreSQL "
                           "the queue lives in")
    return found


def conn() -> psycopg.Connection:
    """This thread's connection: a heartbeat must never run inside the main
    thread's open transaction, and a forked child never shares its parent's."""
    c, pid = getattr(_local, "conn", None), getattr(_local, "pid", None)
    if c is None or c.closed or pid != os.getpid():
        c = _local.conn = psycopg.connect(url(), autocommit=True)
        _local.pid = os.getpid()
    return c


def reset(r=None) -> None:
    """Drop and create this queue's tables (and the effect's)."""
    c = conn()
    with c.transaction():
        c.execute("DROP TABLE IF EXISTS " + ", ".join(TABLES))
        c.execute(SCHEMA)
        c.execute("INSERT INTO pgq_stats VALUES (0)")


# The bound counts pending rows (an index-only count: fine for a course's
# queue, a cost per enqueue for a deep one).
_ENQUEUE = """INSERT INTO pgq_jobs (id, payload)
SELECT %(id)s, %(payload)s
 WHERE (SELECT count(*) FROM pgq_jobs WHERE state = 'pending') < %(bound)s
    OR EXISTS (SELECT 1 FROM pgq_jobs WHERE id = %(id)s)
ON CONFLICT (id) DO NOTHING"""


def enqueue_tx(c: psycopg.Connection, payload: dict, job_id: str | None = None
               ) -> str:
    """Enqueue inside the caller's open transaction (no outbox needed).

    A known id is the same job (a no-op); past QUEUE_MAX pending jobs a new
    one raises QueueFull, as the Redis queue does.
    """
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", DEFAULT_MAX_PENDING))
    cur = c.execute(_ENQUEUE, {"id": job_id, "payload": json.dumps(payload),
                               "bound": bound})
    if cur.rowcount == 0 and not c.execute(
            "SELECT 1 FROM pgq_jobs WHERE id = %s", (job_id,)).fetchone():
        raise QueueFull(f"queue is full ({bound} jobs pending); retry later "
                        "or raise QUEUE_MAX")
    return job_id


def enqueue(r, payload: dict, job_id: str | None = None) -> str:
    return enqueue_tx(conn(), payload, job_id)


_CLAIM = """
UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
       lease_until = clock_timestamp() + make_interval(secs => %s)
 WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
              ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, payload, attempt"""


def claim(r, lease_s: float) -> tuple[str, dict, int] | None:
    """The oldest unlocked pending job with a lease: (job_id, payload, attempt)."""
    row = conn().execute(_CLAIM, (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))


# The fence: this attempt, still in flight, not failed.
_MINE = "id = %s AND attempt = %s AND state = 'inflight' AND NOT failed"


def ack(r, job_id: str, attempt: int) -> bool:
    return conn().execute(f"UPDATE pgq_jobs SET state = 'done', lease_until = NULL"
                          f" WHERE {_MINE}", (job_id, attempt)).rowcount == 1


def extend(r, job_id: str, attempt: int, lease_s: float) -> bool:
    return conn().execute(
        "UPDATE pgq_jobs SET lease_until = clock_timestamp() + "
        f"make_interval(secs => %s) WHERE {_MINE}",
        (lease_s, job_id, attempt)).rowcount == 1


def fail(r, job_id: str, attempt: int, error: str) -> bool:
    """Record the error and expire the lease now; the next reap decides."""
    return conn().execute(
        "UPDATE pgq_jobs SET failed = true, last_error = %s, "
        f"lease_until = '-infinity' WHERE {_MINE}",
        (error, job_id, attempt)).rowcount == 1


_REAP = """
UPDATE pgq_jobs j SET
  state = CASE WHEN j.attempt - j.budget_from >= %(max)s THEN 'dead'
               ELSE 'pending' END,
  last_error = CASE WHEN j.failed THEN j.last_error ELSE %(expired)s END,
  failed = false, lease_until = NULL, queued_at = clock_timestamp()
  FROM (SELECT id FROM pgq_jobs
         WHERE state = 'inflight' AND lease_until <= clock_timestamp()
         ORDER BY lease_until LIMIT %(limit)s FOR UPDATE SKIP LOCKED) expired
 WHERE j.id = expired.id
RETURNING j.id, j.state, j.attempt, j.last_error"""


def reap(r, max_attempts: int = 3) -> tuple[int, int]:
    """Expired leases back to pending, or to the DLQ: (requeued, dead)."""
    c = conn()
    with c.transaction():
        rows = c.execute(_REAP, {"max": max_attempts, "expired": LEASE_EXPIRED,
                                 "limit": REAP_LIMIT}).fetchall()
        dead_rows = [(i, a, e) for i, s, a, e in rows if s == "dead"]
        if dead_rows:
            c.cursor().executemany(
                "INSERT INTO pgq_dead (id, attempts, reason) VALUES (%s, %s, %s)"
                " ON CONFLICT (id) DO UPDATE SET attempts = excluded.attempts,"
                " reason = excluded.reason, died_at = clock_timestamp()", dead_rows)
    return len(rows) - len(dead_rows), len(dead_rows)


def dead(r) -> list[tuple[str, int, str]]:
    """The DLQ: (job_id, attempts, reason), oldest death first."""
    return [tuple(row) for row in conn().execute(
        "SELECT id, attempts, reason FROM pgq_dead ORDER BY died_at, id")]


def redrive(r=None) -> int:
    """Every dead job back to pending with a fresh attempt budget."""
    c = conn()
    with c.transaction():
        ids = [row[0] for row in c.execute("DELETE FROM pgq_dead RETURNING id")]
        c.execute("UPDATE pgq_jobs SET state = 'pending', budget_from = attempt, "
                  "queued_at = clock_timestamp() WHERE id = ANY(%s)", (ids,))
    return len(ids)


def stats(r=None) -> dict:
    rows = dict(conn().execute("SELECT state, count(*) FROM pgq_jobs GROUP BY 1"))
    return {s: int(rows.get(s, 0)) for s in ("pending", "inflight", "done", "dead")}


def finish(r, job_id: str, attempt: int, doc_id, score: float) -> bool:
    """The effect and the ack in one transaction; False: refused, no effect.

    The effect is a plain INSERT with no key, so only the transaction stands
    between a redelivery and a second score.
    """
    c = conn()
    with c.transaction():
        if c.execute(f"UPDATE pgq_jobs SET state = 'done', lease_until = NULL "
                     f"WHERE {_MINE}", (job_id, attempt)).rowcount != 1:
            raise psycopg.Rollback          # ends the block, rolled back
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False


def apply_effect(c: psycopg.Connection, job_id: str, attempt: int, doc_id,
                 score: float) -> None:
    """The job's effect on connection `c`: the score, the counter and the
    ledger the chaos engine reads. Atomic only inside the caller's transaction."""
    c.execute("INSERT INTO pgq_scores VALUES (%s, %s, %s)", (job_id, doc_id, score))
    c.execute("UPDATE pgq_stats SET n = n + 1")
    c.execute("INSERT INTO pgq_applied VALUES (%s, %s, %s, %s)",
              (job_id, attempt, os.getpid(), time.monotonic_ns()))


def ledger() -> tuple[list[tuple], dict]:
    """`finish`'s effects as a judge reads them: in the reader's own process
    and connection, never through the queue module it judges.

    How many times each job's effect happened is the most that any record
    shows: the score table's rows, the `pgq_applied` rows (written by the same
    `apply_effect`) and the counter it bumps; so an effect deleted afterwards
    still counts. The `pgq_applied` rows lend a witness its attempt, pid and
    time. The tables are read as plain ones
    (`handson.infra.trusted_read`), so no view or rule of the queue's decides
    what is seen.
    """
    with psycopg.connect(url(), autocommit=True) as c:
        schema = trusted_read.schema_of(c)
        c.execute("SET search_path = pg_catalog")
        tables = ("pgq_scores", "pgq_applied", "pgq_stats")
        counts = dict(trusted_read.read(
            c, schema, tables, "SELECT job_id, count(*) FROM {pgq_scores} "
            "GROUP BY job_id").fetchall())
        said = trusted_read.read(c, schema, tables, "SELECT job_id, attempt, pid, t "
                             "FROM {pgq_applied} ORDER BY t").fetchall()
        counter = trusted_read.read(c, schema, tables,
                                "SELECT n FROM {pgq_stats}").fetchone()
    witnesses: dict = {}
    for row in said:
        witnesses.setdefault(row[0], []).append(tuple(row))
    end = time.monotonic_ns()
    applied = []
    for job in counts.keys() | witnesses.keys():
        # a score deleted afterwards still happened: the most any record shows
        n = max(counts.get(job, 0), len(witnesses.get(job, ())))
        rows = witnesses.get(job, [])[:n]
        applied += rows + [(job, 0, 0, end)] * (n - len(rows))
    n_counter = int(counter[0]) if counter else 0
    # The counter, bumped by every effect, cannot be told which job: more bumps
    # than the records show are effects of no job the run enqueued.
    applied += [(f"(counter bump {i})", 0, 0, end)
                for i in range(n_counter - len(applied))]
    applied.sort(key=lambda row: row[3])
    rows = sum(counts.values())
    return applied, {"rows": rows, "naive_rows": rows, "naive_distinct": len(counts),
                     "counter": n_counter}


def dead_letters() -> list[tuple[str, int, str]]:
    """The DLQ as a judge reads it (like `ledger`): only jobs whose own row is
    dead, so a done job is never passed off as a dead letter."""
    with psycopg.connect(url(), autocommit=True) as c:
        schema = trusted_read.schema_of(c)
        c.execute("SET search_path = pg_catalog")
        return [tuple(row) for row in trusted_read.read(
            c, schema, ("pgq_dead", "pgq_jobs"),
            "SELECT d.id, d.attempts, d.reason FROM {pgq_dead} d JOIN {pgq_jobs} j"
            " ON j.id = d.id WHERE j.state = 'dead' ORDER BY d.died_at, d.id")]


def effects(r=None) -> tuple[list[tuple], dict]:
    """`finish`'s ledger (job_id, attempt, pid, t) and a results summary, in
    the shape of the SQLite sink's (`handson.verify.summary`). The score table
    has no key whatever IDEM says, so it is counted as both kinds of rows."""
    c = conn()
    applied = [tuple(row) for row in c.execute(
        "SELECT job_id, attempt, pid, t FROM pgq_applied ORDER BY t")]
    rows, distinct = c.execute(
        "SELECT count(*), count(DISTINCT job_id) FROM pgq_scores").fetchone()
    counter = c.execute("SELECT n FROM pgq_stats").fetchone()[0]
    return applied, {"rows": int(rows), "naive_rows": int(rows),
                     "naive_distinct": int(distinct), "counter": int(counter)}
