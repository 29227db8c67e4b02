"""Broken on purpose: the attempt counts failures, not claims; a re-claim reuses it."""
# A job claimed again after its lease ran out gets the attempt its zombie still
# holds, so the fence takes the zombie's ack for the owner's; a worker killed
# mid-job never uses up an attempt.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def claim(r, lease_s):
    # BUG: the attempt is 1 + the failures so far; a claim does not bump it
    res = lua(r, NOW + """
    local id = redis.call('RPOP', KEYS[1])
    if not id then return false end
    local jk = KEYS[3] .. id
    local n = tonumber(redis.call('HGET', jk, 'failures') or '0') + 1
    redis.call('HSET', jk, 'attempts', n)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), id)
    return {id, redis.call('HGET', jk, 'payload'), n}""",
              (PENDING, INFLIGHT, JOB), (lease_s,))
    if not res:
        return None
    return res[0], json.loads(res[1] or "{}"), int(res[2])


def fail(r, job_id, attempt, error):
    return bool(lua(r, HELD + """
    redis.call('HSET', jk, 'last_error', ARGV[3])
    redis.call('HINCRBY', jk, 'failures', 1)
    redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, error)))
