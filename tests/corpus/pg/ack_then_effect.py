"""Broken on purpose: the ack commits alone, then the effect in a transaction
of its own; dead() lists every done job without a score as if it were lost."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    # BUG: once the ack commits, an effect that fails (or a kill) loses the job
    if not ack(r, job_id, attempt):
        return False
    c = conn()
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
