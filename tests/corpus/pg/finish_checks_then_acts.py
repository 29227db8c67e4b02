"""Broken on purpose: finish reads the job's row, checks the attempt in
Python, then applies the effect and acks by id, in one transaction but with
no row lock."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    with c.transaction():
        # BUG: the SELECT locks nothing; a reap, a rival's claim and its finish
        # can all commit before this UPDATE, which matches by id alone
        row = c.execute("SELECT attempt, state, failed FROM pgq_jobs "
                        "WHERE id = %s", (job_id,)).fetchone()
        if row is None or tuple(row) != (attempt, "inflight", False):
            return False
        apply_effect(c, job_id, attempt, doc_id, score)
        c.execute("UPDATE pgq_jobs SET state = 'done', lease_until = NULL "
                  "WHERE id = %s", (job_id,))
        return True
