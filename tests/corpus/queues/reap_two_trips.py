"""Broken on purpose: reap takes expired leases in one script, requeues in more."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def reap(r, max_attempts=3):
    # each step is atomic, and two reapers never share a job; BUG: a reaper
    # that dies between the two scripts takes the jobs it took with it
    taken = lua(r, NOW + """
    local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
    for _, id in ipairs(ids) do redis.call('ZREM', KEYS[1], id) end
    return ids""", (INFLIGHT,), ())
    requeued = dead_n = 0
    for job_id in taken:
        jk = JOB + job_id
        if int(r.hget(jk, "attempts") or 0) >= max_attempts:
            if not r.hget(jk, "last_error"):
                r.hset(jk, "last_error", EXPIRED)
            r.hset(jk, "state", "dead")
            r.rpush(DLQ, job_id)
            dead_n += 1
        else:
            r.rpush(PENDING, job_id)
            requeued += 1
    return requeued, dead_n
