"""Broken on purpose: finish fences on the attempt and the fail but not on
the job still being in flight, so the same attempt finishes twice."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    with c.transaction():
        # BUG: no "AND state = 'inflight'": a done job is acked again
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND NOT failed", (job_id, attempt)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
