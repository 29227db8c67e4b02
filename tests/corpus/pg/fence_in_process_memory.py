"""A wrong queue from a hostile review: finish trusts a dict of this process's
own claims, not the row's attempt (caught when another worker holds the job)."""

import psycopg

from handson.queues import pgq
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

_mine = {}


def claim(r, lease_s):
    got = pgq.claim(r, lease_s)
    if got is not None:
        _mine[got[0]] = got[2]
    return got


def finish(r, job_id, attempt, doc_id, score):
    """the fence kept in this process: my last claim of the job"""
    if _mine.get(job_id) != attempt:
        return False
    c = conn()
    with c.transaction():
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND state = 'inflight'", (job_id,)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
