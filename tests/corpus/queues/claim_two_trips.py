"""Broken on purpose: claim pops, then registers the lease in a second round trip."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    # BUG: two round trips; a worker killed between them takes the job with it
    job_id = r.rpop(PENDING)
    if job_id is None:
        return None
    res = lua(r, NOW + """
    local id = ARGV[2]
    local n = redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), id)
    return {id, redis.call('HGET', KEYS[3] .. id, 'payload'), n}""",
              (PENDING, INFLIGHT, JOB), (lease_s, job_id))
    return res[0], json.loads(res[1] or "{}"), int(res[2])
