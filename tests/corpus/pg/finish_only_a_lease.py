"""Broken on purpose: finish checks only that the job holds a lease, not that
it is this attempt's."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    with c.transaction():
        # BUG: any attempt's lease will do: a zombie finishes over its successor
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND lease_until IS NOT NULL AND NOT failed", (job_id,)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
