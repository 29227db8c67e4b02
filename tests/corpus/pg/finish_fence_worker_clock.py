"""Broken on purpose: finish's fence also asks lease_until > the worker's
own clock (datetime.now), not the server's."""

import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    now = datetime.datetime.now(datetime.timezone.utc)
    with c.transaction():
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND state = 'inflight' AND NOT failed"
            " AND lease_until > %s", (job_id, attempt, now)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
