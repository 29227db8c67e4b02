"""Broken on purpose: claim counts the attempt in a second round trip."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    res = lua(r, NOW + """
    local id = redis.call('RPOP', KEYS[1])
    if not id then return false end
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), id)
    return {id, redis.call('HGET', KEYS[3] .. id, 'payload')}""",
              (PENDING, INFLIGHT, JOB), (lease_s,))
    if not res:
        return None
    # BUG: a worker killed here holds the job, but its attempt is never
    # counted, so a job that kills its worker here never reaches the DLQ
    n = r.hincrby(JOB + res[0], "attempts", 1)
    return res[0], json.loads(res[1] or "{}"), int(n)
