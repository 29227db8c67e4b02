"""Broken on purpose: extend computes the deadline from the worker's clock, so
a worker whose clock is behind the server's sets a lease that has already run
out (and one ahead keeps it far too long)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change
from correct import INFLIGHT, JOBS


def extend(r, job_id, attempt, lease_s):
    script = """
    local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
    if not lease or tonumber(lease) == 0 then return 0 end
    if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
      return 0
    end
    redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
    return 1
    """
    # BUG: this process's now, not the server's TIME
    deadline = round((time.time() + lease_s) * 1000)
    return bool(r.eval(script, 2, INFLIGHT, JOBS, job_id, int(attempt), deadline))
