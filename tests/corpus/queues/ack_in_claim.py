"""Broken on purpose: claim deletes the job, i.e. acks before the work is done."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    res = lua(r, NOW + """
    local id = redis.call('RPOP', KEYS[1])
    if not id then return false end
    local n = redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)
    -- BUG: no lease; the job is finished the moment it is handed out
    redis.call('HSET', KEYS[3] .. id, 'state', 'done')
    return {id, redis.call('HGET', KEYS[3] .. id, 'payload'), n}""",
              (PENDING, INFLIGHT, JOB), (lease_s,))
    if not res:
        return None
    return res[0], json.loads(res[1] or "{}"), int(res[2])
