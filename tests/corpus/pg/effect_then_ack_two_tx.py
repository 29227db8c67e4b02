"""Broken on purpose: the effect, then the ack, in two transactions; the
effect replaces an earlier score of the job, and a refused ack takes its own
back (the effect's other records still count)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    # BUG: killed between the two commits, the job runs again: a second effect
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
