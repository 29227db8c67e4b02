"""A wrong queue from a hostile review: the ack, then the effect; dead() lists
every done job without a score (caught: an acked job is never earned dead)."""

from handson.queues.pgq import (  # noqa: F401 - the rest of the course's queue
    STATE_OUTSIDE_REDIS,
    ack,
    apply_effect,
    claim,
    conn,
    effects,
    enqueue,
    extend,
    fail,
    reap,
    redrive,
    reset,
    stats,
)


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    if not ack(r, job_id, attempt):
        return False
    with c.transaction():
        apply_effect(c, job_id, attempt, doc_id, score)
    return True


def dead(r):
    """the DLQ, and every done job with no score"""
    return [tuple(x) for x in conn().execute(
        "SELECT id, attempts, reason FROM pgq_dead UNION ALL "
        "SELECT id, attempt, 'worker died before its effect' FROM pgq_jobs j "
        "WHERE state = 'done' AND NOT EXISTS "
        "(SELECT 1 FROM pgq_scores s WHERE s.job_id = j.id)")]
