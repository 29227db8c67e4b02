"""Broken on purpose: extend renews by whole seconds (a 0.25 s lease gets none)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: int() drops the fraction: short leases end at the heartbeat itself
    return bool(lua(r, NOW + HELD + """
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, int(lease_s))))
