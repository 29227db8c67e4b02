"""Broken on purpose: ack checks the lease in one round trip, removes it in the next."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def ack(r, job_id, attempt):
    # BUG: between the read and the write, reap and a new claim can run; the
    # zombie then removes the new owner's lease
    lease, current = r.zscore(INFLIGHT, job_id), r.hget(JOB + job_id, "attempts")
    if lease is None or current is None or int(current) != int(attempt):
        return False
    p = r.pipeline()
    p.zrem(INFLIGHT, job_id)
    p.hset(JOB + job_id, "state", "done")
    p.execute()
    return True
