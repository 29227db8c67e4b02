"""A wrong queue from a hostile review: the effect, then the ack, in two
transactions; the effect deletes an earlier score of the job, and a refused
ack takes its own back (caught: the effect's other records still count)."""

from handson.queues.pgq import (  # noqa: F401 - the rest of the course's queue
    STATE_OUTSIDE_REDIS,
    ack,
    apply_effect,
    claim,
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


def finish(r, job_id, attempt, doc_id, score):
    """effect, then ack, in two transactions; the effect replaces an earlier
    score of the job, and a refused ack takes its effect back"""
    c = conn()
    with c.transaction():
        c.execute("DELETE FROM pgq_scores WHERE job_id = %s", (job_id,))
        apply_effect(c, job_id, attempt, doc_id, score)
    with c.transaction():
        ok = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND state = 'inflight' AND NOT failed",
            (job_id, attempt)).rowcount == 1
    if not ok:
        c.execute("DELETE FROM pgq_scores WHERE job_id = %s AND NOT EXISTS ("
                  "SELECT 1 FROM pgq_jobs WHERE id = %s AND state = 'done')",
                  (job_id, job_id))
    return ok
