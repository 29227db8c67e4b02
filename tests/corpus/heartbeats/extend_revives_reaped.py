"""Broken on purpose: extend sets the deadline whether or not the lease is
still there: a late heartbeat puts a reaped job back in flight."""

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
    if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
      return 0
    end
    -- BUG: ZADD without XX and no ZSCORE first: it creates the lease again
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
    return 1
    """
    ms = max(1, round(lease_s * 1000))
    return bool(r.eval(script, 2, INFLIGHT, JOBS, job_id, int(attempt), ms))
