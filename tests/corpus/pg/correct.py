"""My PostgreSQL queue: the course's, with my claim and my transactional ack."""

import psycopg

from handson.queues.pgq import (  # noqa: F401 - the rest of the course's queue
    STATE_OUTSIDE_REDIS,
    ack,
    apply_effect,
    conn,
    dead,
    effects,
    enqueue,
    extend,
    fail,
    reap,
    redrive,
    reset,
    stats,
)


def claim(r, lease_s):
    """The oldest pending job no other transaction holds, with a server lease."""
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                      ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id, payload, attempt""", (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))


def finish(r, job_id, attempt, doc_id, score):
    """The ack and the effect commit together, or neither does."""
    c = conn()
    with c.transaction():
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND state = 'inflight' AND NOT failed",
            (job_id, attempt)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
