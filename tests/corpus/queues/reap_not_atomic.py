"""Broken on purpose: reap reads expired leases, then requeues in separate steps."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def reap(r, max_attempts=3):
    # BUG: read, then act, in separate round trips; two reapers that read the
    # same expired lease both requeue it, so two workers get the job at once.
    requeued = dead_n = 0
    t = r.time()
    for job_id in r.zrangebyscore(INFLIGHT, "-inf", t[0] + t[1] / 1e6):
        attempts, error = r.hmget(JOB + job_id, "attempts", "last_error")
        r.zrem(INFLIGHT, job_id)
        if int(attempts or 0) >= max_attempts:
            r.hset(JOB + job_id, mapping={"state": "dead",
                                          "last_error": error or EXPIRED})
            r.rpush(DLQ, job_id)
            dead_n += 1
        else:
            r.rpush(PENDING, job_id)
            requeued += 1
    return requeued, dead_n
