"""The queue inside PostgreSQL, measured beside the Redis queue.

- `side_by_side`: one chaos run (SIGKILLs at random and right after the
  commit) per way of making the effect once: the Redis queue with a dedup key,
  the PostgreSQL queue with its ack after the commit and no key, and the
  PostgreSQL queue with the effect in the ack's transaction and no key.
- `claim_ack_rate`: claims and acks per second from one client, no work: what
  each job costs the queue itself.
- `backlog`: a long backlog claimed and acked with vacuum off, in slices:
  each slice's rate and the dead row versions left behind, then VACUUM.

    python -m handson.pg_runs          # needs PostgreSQL (initdb) and Redis
"""

from __future__ import annotations

import contextlib
import os
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
                          s["counter"], s.get("enqueued", docs)))
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
        print(backlog())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
