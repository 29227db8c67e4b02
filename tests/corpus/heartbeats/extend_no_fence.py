"""Broken on purpose: extend pushes any live lease, whoever holds it: a zombie's
heartbeat keeps the new owner's lease alive."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change
from correct import INFLIGHT, JOBS


def extend(r, job_id, attempt, lease_s):
    script = """
    redis.replicate_commands()
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
    if not lease or tonumber(lease) == 0 then return 0 end
    -- BUG: no look at the job's current attempt (the fencing token)
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
    return 1
    """
    ms = max(1, round(lease_s * 1000))
    return bool(r.eval(script, 2, INFLIGHT, JOBS, job_id, int(attempt), ms))
