"""A correct alternative: the fence is the attempt and a lease still running
on the SERVER's clock (lease_until > clock_timestamp()): in flight, not
failed (-infinity), not done (NULL); an expired, unreaped lease is refused."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def finish(r, job_id, attempt, doc_id, score):
    c = conn()
    with c.transaction():
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND lease_until > clock_timestamp()",
            (job_id, attempt)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
