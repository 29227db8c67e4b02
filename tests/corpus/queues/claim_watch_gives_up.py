"""Broken on purpose: a WATCH/MULTI claim that returns None when it loses a race."""

import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    with r.pipeline() as p:
        try:
            p.watch(PENDING)
            job_id = p.lindex(PENDING, -1)
            if job_id is None:
                return None
            sec, usec = p.time()
            p.multi()
            p.rpop(PENDING)
            p.hincrby(JOB + job_id, "attempts", 1)
            p.zadd(INFLIGHT, {job_id: sec + usec / 1e6 + lease_s})
            p.hget(JOB + job_id, "payload")
            _, n, _, payload = p.execute()
        except redis.WatchError:
            # BUG: another claimer won; this says "nothing pending" while
            # jobs wait (retry instead)
            return None
    return job_id, json.loads(payload or "{}"), int(n)
