"""Broken on purpose: extend takes the new deadline from the worker's own clock."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: the reaper compares deadlines with the server's clock; a worker
    # whose clock is behind renews a lease that has already run out
    return bool(lua(r, HELD + """
    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, time.time() + lease_s)))
