"""Broken on purpose: extend re-adds a lease that was reaped (no XX, no fence)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: plain ZADD and no attempt check: a zombie's heartbeat brings back a
    # lease that reap already took away, or stretches the new owner's lease
    return bool(lua(r, NOW + """
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, lease_s)))
