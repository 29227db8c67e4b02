"""Broken on purpose: claim takes the lease deadline from the worker's own clock."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    # BUG: the deadline comes from this machine's clock, the reaper's from the
    # server's; a worker whose clock is behind loses its lease at once
    res = lua(r, """
    local id = redis.call('RPOP', KEYS[1])
    if not id then return false end
    local n = redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)
    redis.call('ZADD', KEYS[2], tonumber(ARGV[1]), id)
    return {id, redis.call('HGET', KEYS[3] .. id, 'payload'), n}""",
              (PENDING, INFLIGHT, JOB), (time.time() + lease_s,))
    if not res:
        return None
    return res[0], json.loads(res[1] or "{}"), int(res[2])
