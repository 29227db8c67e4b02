"""The queue inside PostgreSQL, measured beside the Redis queue.

- `side_by_side`: one chaos run (SIGKILLs at random and right after the
  commit) per way of making the effect once: the Redis queue with a dedup key,
  the PostgreSQL queue with its ack after the commit and no key, and the
  PostgreSQL queue with the effect in the ack's transaction and no key.
- `claim_ack_rate`: claims and acks per second from one client, no work: what
  each job costs the queue itself.
- `costs`: what a commit costs with fsync on and off (and synchronous_commit on
  and off), and the claim-and-ack rate of the Redis queue and the PostgreSQL
  queue, each with the durability its server had, read from the server.
- `backlog`: a long backlog claimed and acked with vacuum off, in slices:
  each slice's rate and the dead row versions left behind, then VACUUM.
- `claim_race`: claimers racing for the head of the queue at READ COMMITTED
  (what the queue relies on) and at REPEATABLE READ, where the losers of the
  race get SQLSTATE 40001 instead of the next job.
- `hung_finish`: a worker that hangs inside `finish`'s transaction holding the
  row's lock, which the reaper skips, without and with
  `idle_in_transaction_session_timeout` on the worker's session.
- `hot_counter`: concurrent `finish`es with the one counter row every one of
  them updates, with a counter row per worker, and with no counter.
- `slot_state`: a logical slot's positions and `catalog_xmin` as the server
  reports them, while transactions go by unconfirmed.

    python -m handson.pg_runs          # needs PostgreSQL (initdb) and Redis
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from dataclasses import dataclass

from handson.faults.engine import ChaosConfig, Report, run

SIDES = {   # label -> (queue, effect in the ack's transaction, dedup key)
    "Redis queue, dedup key": ("handson.q", False, True),
    "PostgreSQL queue, ack after the commit, no key": ("handson.queues.pgq", False,
                                                       False),
    "PostgreSQL queue, effect in the ack's transaction, no key":
        ("handson.queues.pgq", True, False),
}


@dataclass
class Side:
    label: str
    verdict: str
    kills: int
    after_commit_kills: int
    applied_twice: int
    lost: int
    dead_letter: int     # jobs in the dead-letter table: the poison, no effect
    effects: int
    jobs: int


def side_by_side(redis_url: str, docs: int = 150, seed: int = 1
                 ) -> tuple[list[Side], list[Report]]:
    """The same workload and faults on each side. PGQ_URL must be set."""
    sides, reports = [], []
    for label, (queue, tx, key) in SIDES.items():
        cfg = ChaosConfig(queue=queue, docs=docs, workers=3, kill_every=0.6,
                          min_kills=4, seed=seed, idem=key, iters=2000,
                          lease_s=1.0, crash_points=("after-commit",), crash_p=0.1,
                          min_crash_kills=3, tx_effect=tx)
        rep = run(cfg, redis_url=redis_url)
        s = rep.stats
        sides.append(Side(label, rep.verdict, s["kills"],
                          s["faults"]["crash_kills"]["after-commit"],
                          rep.invariants["applied_twice"].count, s["lost"],
                          s["dlq"], s["counter"], s.get("enqueued", docs)))
        reports.append(rep)
    return sides, reports


def claim_ack_rate(queue, r, n: int = 2000) -> float:
    """Jobs per second through claim and ack from one client (no work)."""
    if hasattr(queue, "reset"):
        queue.reset(r)
    for i in range(n):
        queue.enqueue(r, {"doc_id": i}, job_id=f"rate-{i}")
    t = time.perf_counter()
    done = 0
    while (job := queue.claim(r, 30.0)) is not None:
        queue.ack(r, job[0], job[2])
        done += 1
    if done != n:
        raise AssertionError(f"{done} of {n} jobs came out of {queue.__name__}")
    return n / (time.perf_counter() - t)


# --- what durability costs ------------------------------------------------------

def fsync_on_postgres():
    """A second throwaway cluster, made by the same code as the course's, with
    fsync on (the course's runs with it off: a command-line setting, which
    `ALTER SYSTEM` cannot switch); `pg_settings` reads the setting back."""
    from handson.infra import pg_server

    return pg_server.throwaway_postgres(fsync=True)


def server_version(url: str) -> int:
    """The server's version number (170002 for 17.2)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return int(c.execute("SHOW server_version_num").fetchone()[0])


def pg_settings(url: str) -> dict[str, str]:
    """The server's fsync and synchronous_commit (its default for sessions)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return {name: c.execute(f"SHOW {name}").fetchone()[0]
                for name in ("fsync", "synchronous_commit")}


def redis_settings(r) -> dict[str, str]:
    """appendonly, appendfsync and save as the server reports them ({} if it
    refuses CONFIG, as managed Redis services do)."""
    try:
        got = r.config_get("append*") | r.config_get("save")
    except Exception:       # noqa: BLE001 - any refusal: unknown
        return {}
    return {k if isinstance(k, str) else k.decode():
            v if isinstance(v, str) else v.decode() for k, v in got.items()}


def pg_durability(fsync: str, synchronous_commit: str) -> tuple[str, str]:
    """(the settings, what a commit acknowledged under them survives)."""
    said = f"fsync {fsync}, synchronous_commit {synchronous_commit}"
    if synchronous_commit == "off":
        return said, "not a crash of the server: its last commits can be lost"
    if fsync == "off":
        return said, "a crash of the server, not of the machine"
    return said, "a crash of the machine"


def redis_durability(settings: dict[str, str]) -> tuple[str, str]:
    """(the settings, what a write Redis acknowledged under them survives)."""
    if not settings:
        return "unknown", "unknown: the server refused CONFIG GET"
    if settings.get("appendonly") == "yes":
        fsync = settings.get("appendfsync", "")
        return f"appendfsync {fsync}", {
            "always": "a crash of the machine",
            "everysec": "a crash of the server; of the machine, all but the "
                        "last second",
        }.get(fsync, "a crash of the server, not of the machine")
    if settings.get("save"):
        return (f"snapshots ({settings['save']})",
                "not a crash: writes since the last snapshot are lost")
    return "no AOF, no snapshots", "not even a restart of the server"


def faster(a: str, rate_a: float, b: str, rate_b: float) -> str:
    """"the A was 2.3 times faster", or "the A and the B were within 10% of
    each other": the words chosen by the two rates."""
    (hi, r_hi), (lo, r_lo) = sorted([(a, rate_a), (b, rate_b)],
                                    key=lambda x: -x[1])
    if r_hi < 1.1 * r_lo:
        return f"the {a} and the {b} were within 10% of each other"
    return f"the {hi} was {r_hi / r_lo:.1f} times faster"


def slower(what: str, ms: float, base_ms: float) -> str:
    """"<what> 3.8 times slower" (or faster, or "no slower"): the words chosen
    by the two times."""
    if ms >= 1.1 * base_ms:
        return f"{what} {ms / base_ms:.1f} times slower"
    if base_ms >= 1.1 * ms:
        return f"{what} {base_ms / ms:.1f} times faster"
    return f"{what} no slower (within 10%)"


@dataclass
class CommitCost:
    fsync: str
    synchronous_commit: str
    commits: int
    median_ms: float


@dataclass
class QueueCost:
    queue: str
    settings: str
    acked_job_survives: str
    jobs_per_s: int


@dataclass
class Costs:
    commits: list[CommitCost]   # fsync off, then on; synchronous_commit on, off
    queues: list[QueueCost]     # Redis as the chapter runs it, Redis with
    #   appendfsync always, PostgreSQL as the chapter runs it, with fsync on


def commit_cost(urls: list[str], n: int = 300, rounds: int = 5
                ) -> list[CommitCost]:
    """The median time of a one-row INSERT that commits on its own, per server
    and per synchronous_commit (on, off), in `rounds` interleaved rounds of
    n / rounds commits, so a busy moment of the machine hits each alike."""
    import psycopg

    sessions = []       # (fsync, synchronous_commit, connection, times)
    with contextlib.ExitStack() as stack:
        for url in urls:
            fsync = pg_settings(url)["fsync"]
            for sync in ("on", "off"):
                c = stack.enter_context(psycopg.connect(url, autocommit=True))
                c.execute(f"SET synchronous_commit = {sync}")
                c.execute("CREATE TABLE IF NOT EXISTS commit_cost (n int)")
                sessions.append((fsync, sync, c, []))
        for _ in range(rounds):
            for _, _, c, got in sessions:
                for k in range(max(1, n // rounds)):
                    t = time.perf_counter()
                    c.execute("INSERT INTO commit_cost VALUES (%s)", (k,))
                    got.append(time.perf_counter() - t)
        for _, sync, c, _ in sessions:
            if sync == "on":            # one session per server
                c.execute("DROP TABLE IF EXISTS commit_cost")
    return [CommitCost(fsync, sync, len(got),
                       round(statistics.median(got) * 1000, 3))
            for fsync, sync, _, got in sessions]


@contextlib.contextmanager
def pgq_on(url: str, synchronous_commit: str = "on"):
    """The PostgreSQL queue (`handson.queues.pgq`) on the server at `url`, its
    sessions with this synchronous_commit; PGQ_URL as it was afterwards."""
    from handson.queues import pgq

    old = os.environ.get("PGQ_URL")
    os.environ["PGQ_URL"] = url
    pgq.conn().close()          # the next call connects to PGQ_URL as it is now
    try:
        pgq.conn().execute(f"SET synchronous_commit = {synchronous_commit}")
        yield pgq
    finally:
        pgq.conn().close()
        if old is None:
            os.environ.pop("PGQ_URL", None)
        else:
            os.environ["PGQ_URL"] = old


def costs(redis_url: str, pg_url: str, n: int = 500) -> Costs:
    """Commit costs on the chapter's PostgreSQL (`pg_url`) and on a second one
    with fsync on; then claim+ack per second through the Redis queue on the
    chapter's Redis and on one with `appendfsync always`, and through the
    PostgreSQL queue on each PostgreSQL. Each row says what its server's
    settings promise (read from the server, not assumed)."""
    from handson import q
    from handson.redis_server import connect
    from handson.redis_server import redis_url as private_redis

    with fsync_on_postgres() as durable, \
            private_redis(appendfsync="always") as aof:
        commits = commit_cost([pg_url, durable])
        queues = []
        for url in (redis_url, aof):
            r = connect(url, decode_responses=True)
            with contextlib.closing(r):
                queues.append(QueueCost(
                    "Redis queue", *redis_durability(redis_settings(r)),
                    round(claim_ack_rate(q, r, n))))
        r = connect(redis_url, decode_responses=True)
        with contextlib.closing(r):
            for url, sync in ((pg_url, None), (durable, "on"), (durable, "off")):
                got = pg_settings(url)
                sync = sync or got["synchronous_commit"]
                with pgq_on(url, sync) as pgq:
                    queues.append(QueueCost(
                        "PostgreSQL queue", *pg_durability(got["fsync"], sync),
                        round(claim_ack_rate(pgq, r, n))))
    return Costs(commits, queues)


@dataclass
class Backlog:
    jobs: int
    slice: int
    rates: list[float]          # jobs/s of each slice, first to last
    dead_rows: list[int]        # dead row versions after each slice
    claim_pages: list[int]      # buffer pages the next claim reads, then
    dead_after_vacuum: int
    pages_after_vacuum: int
    rate_after_vacuum: float


def _dead_rows(conn) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.05)
    return int(conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                            "WHERE relname = 'pgq_jobs'").fetchone()[0])


def _claim_pages(conn) -> int:
    """Buffer pages (index and table) that finding the next job reads."""
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM pgq_jobs "
        "WHERE state = 'pending' ORDER BY queued_at, id LIMIT 1 "
        "FOR UPDATE SKIP LOCKED").fetchone()[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


def backlog(jobs: int = 6000, slice_: int = 1000) -> Backlog:
    """Enqueue `jobs`, then claim and ack them slice by slice with autovacuum
    off for the table; the last slice is taken after a VACUUM."""
    from handson.queues import pgq

    pgq.reset()
    c = pgq.conn()
    c.execute("ALTER TABLE pgq_jobs SET (autovacuum_enabled = off)")
    with c.transaction():
        for i in range(jobs):
            pgq.enqueue(None, {"doc_id": i}, f"b-{i:06d}")
    rates, dead, pages = [], [], []

    def one_slice() -> float:
        t = time.perf_counter()
        for _ in range(slice_):
            job = pgq.claim(None, 30.0)
            pgq.ack(None, job[0], job[2])
        return slice_ / (time.perf_counter() - t)

    for _ in range(jobs // slice_ - 1):
        rates.append(one_slice())
        dead.append(_dead_rows(c))
        pages.append(_claim_pages(c))
    c.execute("VACUUM pgq_jobs")
    after = _dead_rows(c)
    return Backlog(jobs, slice_, rates, dead, pages, after, _claim_pages(c),
                   one_slice())


@dataclass
class Race:
    isolation: str
    workers: int
    jobs: int
    claimed: int                # distinct jobs claimed, of `jobs`
    refused: int                # claims that failed with SQLSTATE 40001
    late_claimer: str           # what a claimer got whose snapshot predates a
    #                             rival's claim (its job id, or its SQLSTATE)


def claim_race(isolation: str, workers: int = 4, jobs: int = 1000) -> Race:
    """`workers` threads drain a backlog of `jobs` with `pgq`'s claim, one
    statement per transaction, at `isolation`; a claim refused with SQLSTATE
    40001 is counted and tried again (`pgq.claim` itself would raise). Then
    the race made certain: a claimer's transaction takes its snapshot, a
    rival claims the head job and commits, and the first one claims."""
    import psycopg

    from handson.queues import pgq

    def session() -> psycopg.Connection:
        c = psycopg.connect(pgq.url(), autocommit=True)
        c.execute(f"SET default_transaction_isolation = '{isolation}'")
        return c

    pgq.reset()
    with pgq.conn().transaction():
        for i in range(jobs):
            pgq.enqueue(None, {"doc_id": i}, f"race-{i:05d}")
    claimed, refused, lock = set(), [0], threading.Lock()

    def worker() -> None:
        with session() as c:
            while True:
                try:
                    row = c.execute(pgq._CLAIM, (30.0,)).fetchone()
                except psycopg.errors.SerializationFailure:
                    with lock:
                        refused[0] += 1
                    continue
                if row is None:
                    return
                with lock:
                    claimed.add(row[0])

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    pgq.reset()
    for i in range(2):
        pgq.enqueue(None, {"doc_id": i}, f"late-{i}")
    with session() as late, session() as rival:
        late.execute("BEGIN")
        late.execute("SELECT count(*) FROM pgq_jobs")     # its snapshot, now
        rival.execute(pgq._CLAIM, (30.0,))                # takes late-0, commits
        try:
            got = late.execute(pgq._CLAIM, (30.0,)).fetchone()[0]
        except psycopg.errors.SerializationFailure as err:
            got = f"SQLSTATE {err.sqlstate}"
        late.execute("ROLLBACK")
    return Race(isolation, workers, jobs, len(claimed), refused[0], got)


@dataclass
class Hung:
    timeout: str                # the worker session's
    #                             idle_in_transaction_session_timeout
    lease_s: float
    watched_s: float            # from the locking UPDATE sent to the job back
    #                             (or the end of the watch)
    reaps: int                  # reap calls while watching
    skipped: int                # reaps that found the job's lease expired and
    #                             left it (the row was locked)
    job_back: bool              # a reap took it back within the watch
    worker_ended: str           # what the worker's session said afterwards


def hung_finish(timeout_s: float | None, lease_s: float = 0.2,
                watch_s: float = 3.0, every_s: float = 0.05) -> Hung:
    """A worker claims a job with a short lease, opens `finish`'s transaction,
    runs its first statement (the fenced UPDATE: the row is now locked) and
    hangs: no commit. The reaper runs every `every_s` for up to `watch_s`.
    With `timeout_s`, the worker's session has
    idle_in_transaction_session_timeout set to it."""
    import psycopg

    from handson.queues import pgq

    pgq.reset()
    pgq.enqueue(None, {"doc_id": 1}, "hung-1")
    with psycopg.connect(pgq.url(), autocommit=True) as worker:
        if timeout_s is not None:
            worker.execute("SELECT set_config('idle_in_transaction_session_"
                           "timeout', %s, false)", (f"{int(timeout_s * 1000)}ms",))
        timeout = worker.execute(
            "SHOW idle_in_transaction_session_timeout").fetchone()[0]
        job_id, _, attempt = worker.execute(pgq._CLAIM, (lease_s,)).fetchone()
        worker.execute("BEGIN")
        # Timed from before the UPDATE: the server's idle timer starts once it
        # has answered, a little before the client hears it, and timed from
        # then a job freed at 500 ms read back at 0.49 s.
        t0 = time.perf_counter()
        worker.execute(f"UPDATE pgq_jobs SET state = 'done', lease_until = NULL "
                       f"WHERE {pgq._MINE}", (job_id, attempt))
        reaps = skipped = 0
        back = False
        while (elapsed := time.perf_counter() - t0) < watch_s:
            expired = pgq.conn().execute(
                "SELECT lease_until <= clock_timestamp() FROM pgq_jobs "
                "WHERE id = %s", (job_id,)).fetchone()[0]
            requeued, _ = pgq.reap(None)
            reaps += 1
            if requeued:
                back = True
                elapsed = time.perf_counter() - t0      # the job is back now
                break
            skipped += bool(expired)
            time.sleep(every_s)
        try:
            worker.execute("SELECT 1")
            worker.execute("ROLLBACK")
            ended = "still open (rolled back by the run)"
        except psycopg.Error as err:
            ended = f"ended by the server (SQLSTATE {err.sqlstate})"
    return Hung(timeout, lease_s, round(elapsed, 2), reaps, skipped, back, ended)


@dataclass
class Counter:
    counter: str
    workers: int
    jobs: int
    jobs_per_s: int
    lock_waits: int             # sampled sessions waiting on a row's lock
    samples: int
    total: int                  # what the counter read afterwards


COUNTERS = {
    "one row": ("CREATE TABLE hot_counter (n bigint NOT NULL);"
                "INSERT INTO hot_counter VALUES (0)",
                "UPDATE hot_counter SET n = n + 1", "SELECT n FROM hot_counter"),
    "a row per worker": (
        "CREATE TABLE hot_counter (worker int PRIMARY KEY, n bigint NOT NULL);"
        "INSERT INTO hot_counter SELECT g, 0 FROM generate_series(0, 63) g",
        "UPDATE hot_counter SET n = n + 1 WHERE worker = %(worker)s",
        "SELECT sum(n) FROM hot_counter"),
    "none (count the done rows)": (
        "CREATE TABLE hot_counter ()", None,
        "SELECT count(*) FROM pgq_jobs WHERE state = 'done'"),
}


def hot_counter(kind: str, workers: int = 4, jobs: int = 600) -> Counter:
    """`workers` threads claim and `finish` a backlog of `jobs`, each with its
    own connection, the effect's counter kept as `kind` says (COUNTERS); a
    sampler counts the sessions waiting on another transaction's row lock
    every 2 ms."""
    import psycopg

    from handson.queues import pgq

    create, bump, read = COUNTERS[kind]
    pgq.reset()
    c = pgq.conn()
    c.execute("DROP TABLE IF EXISTS hot_counter")
    for statement in create.split(";"):
        c.execute(statement)
    with c.transaction():
        for i in range(jobs):
            pgq.enqueue(None, {"doc_id": i}, f"hot-{i:05d}")
    go, stop = threading.Barrier(workers + 1), threading.Event()
    waits, samples = [0], [0]

    def worker(k: int) -> None:
        with psycopg.connect(pgq.url(), autocommit=True) as w:
            go.wait()
            while (row := w.execute(pgq._CLAIM, (30.0,)).fetchone()) is not None:
                with w.transaction():
                    w.execute(f"UPDATE pgq_jobs SET state = 'done', lease_until ="
                              f" NULL WHERE {pgq._MINE}", (row[0], row[2]))
                    w.execute("INSERT INTO pgq_scores VALUES (%s, %s, 1.0)",
                              (row[0], row[1]["doc_id"]))
                    if bump:
                        w.execute(bump, {"worker": k} if "%(" in bump else None)
                    w.execute("INSERT INTO pgq_applied VALUES (%s, %s, %s, %s)",
                              (row[0], row[2], os.getpid(), time.monotonic_ns()))

    def sampler() -> None:
        with psycopg.connect(pgq.url(), autocommit=True) as s:
            go.wait()
            while not stop.is_set():
                waits[0] += s.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event IN "
                    "('transactionid', 'tuple') AND datname = current_database()"
                ).fetchone()[0]
                samples[0] += 1
                time.sleep(0.002)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(workers)]
    watch = threading.Thread(target=sampler)
    for t in [*threads, watch]:
        t.start()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    stop.set()
    watch.join()
    total = int(c.execute(read).fetchone()[0])
    c.execute("DROP TABLE hot_counter")
    return Counter(kind, workers, jobs, round(jobs / took), waits[0], samples[0],
                   total)


def hot_counters(workers: int = 4, jobs: int = 600, rounds: int = 3
                 ) -> list[Counter]:
    """Each kind of counter `rounds` times, interleaved, so a busy moment of
    the machine hits each alike: the median rate, the lock waits summed."""
    runs: dict[str, list[Counter]] = {kind: [] for kind in COUNTERS}
    for _ in range(rounds):
        for kind in COUNTERS:
            runs[kind].append(hot_counter(kind, workers, jobs))
    return [Counter(kind, workers, jobs,
                    round(statistics.median(x.jobs_per_s for x in got)),
                    sum(x.lock_waits for x in got), sum(x.samples for x in got),
                    got[-1].total)
            for kind, got in runs.items()]


@dataclass
class SlotState:
    after: str                  # what happened since the slot was made
    restart_lsn: str
    confirmed_flush_lsn: str
    catalog_xmin: int
    next_xid: int               # the server's next transaction id
    retained_kib: float         # WAL kept from restart_lsn


def slot_state(url: str, transactions: int = 200, slot: str = "eo_slot_state"
               ) -> list[SlotState]:
    """A fresh logical slot read from `pg_replication_slots`: when made, after
    `transactions` commits nobody confirms, and after a peek-and-confirm of
    all of them and a CHECKPOINT. Dropped afterwards."""
    import psycopg

    def read(c, after: str) -> SlotState:
        row = c.execute(
            "SELECT restart_lsn::text, confirmed_flush_lsn::text, "
            "catalog_xmin::text::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
            "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        nxt = c.execute("SELECT txid_snapshot_xmax(txid_current_snapshot())"
                        ).fetchone()[0]
        return SlotState(after, row[0], row[1], int(row[2]), int(nxt),
                         round(float(row[3]) / 1024, 1))

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                  "pg_replication_slots WHERE slot_name = %s", (slot,))
        c.execute("SELECT pg_create_logical_replication_slot(%s, "
                  "'test_decoding')", (slot,))
        try:
            c.execute("CREATE TABLE IF NOT EXISTS slot_state_demo (n int)")
            got = [read(c, "slot made")]
            for i in range(transactions):
                c.execute("INSERT INTO slot_state_demo VALUES (%s)", (i,))
            got.append(read(c, f"{transactions} commits, none confirmed"))
            c.execute("SELECT count(*) FROM pg_logical_slot_get_changes(%s, NULL,"
                      " NULL)", (slot,))
            c.execute("CHECKPOINT")
            c.execute("SELECT count(*) FROM pg_logical_slot_get_changes(%s, NULL,"
                      " NULL)", (slot,))
            got.append(read(c, "all read and confirmed, CHECKPOINT"))
            return got
        finally:
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            c.execute("DROP TABLE IF EXISTS slot_state_demo")


def main() -> int:
    from handson.infra import pg_server
    from handson.redis_server import connect, redis_url

    with pg_server.postgres_url() as pg, redis_url() as url:
        os.environ["PGQ_URL"] = pg
        from handson import q
        from handson.queues import pgq

        sides, _ = side_by_side(url)
        for s in sides:
            print(s)
        r = connect(url, decode_responses=True)
        with contextlib.closing(r):
            print("claim+ack per s: redis", round(claim_ack_rate(q, r)),
                  "postgres", round(claim_ack_rate(pgq, r)))
        found = costs(url, pg)
        for row in [*found.commits, *found.queues]:
            print(row)
        print(backlog())
        for level in ("read committed", "repeatable read"):
            print(claim_race(level))
        for timeout in (None, 1.0):
            print(hung_finish(timeout))
        for row in hot_counters():
            print(row)
        for row in slot_state(pg):
            print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
