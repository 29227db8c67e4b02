"""Broken on purpose: fail records the error for whoever holds the job."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def fail(r, job_id, attempt, error):
    # BUG: no fence: a zombie's fail ends the lease of the attempt that
    # replaced it, and the job is handed out while that attempt still works
    return bool(lua(r, """
    if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    redis.call('HSET', KEYS[2] .. ARGV[1], 'last_error', ARGV[2])
    redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, error)))
