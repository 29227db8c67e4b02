"""A correct alternative: finish locks the job's row (FOR UPDATE), checks the
fence in Python, then applies the effect and acks, all in one transaction."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    with c.transaction():
        row = c.execute("SELECT attempt, state, failed FROM pgq_jobs "
                        "WHERE id = %s FOR UPDATE", (job_id,)).fetchone()
        if row is None or tuple(row) != (attempt, "inflight", False):
            return False
        apply_effect(c, job_id, attempt, doc_id, score)
        c.execute("UPDATE pgq_jobs SET state = 'done', lease_until = NULL "
                  "WHERE id = %s", (job_id,))
        return True
