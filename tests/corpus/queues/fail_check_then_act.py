"""Broken on purpose: fail checks the attempt, then ends the lease later."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def fail(r, job_id, attempt, error):
    # BUG: a reap and a new claim between the two steps, and the zombie's
    # write ends the new owner's lease
    p = r.pipeline(transaction=False)
    p.zscore(INFLIGHT, job_id)
    p.hget(JOB + job_id, "attempts")
    lease, current = p.execute()
    if lease is None or current is None or int(current) != int(attempt):
        return False
    p = r.pipeline()
    p.hset(JOB + job_id, "last_error", error)
    p.zadd(INFLIGHT, {job_id: 0}, xx=True)
    p.execute()
    return True
