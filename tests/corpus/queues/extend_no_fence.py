"""Broken on purpose: extend moves the deadline of whoever holds the lease."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: "the worker has the job id, so it is the owner": a zombie's
    # heartbeat keeps alive the lease of the attempt that replaced it
    return bool(lua(r, NOW + """
    if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
    return 1""", (INFLIGHT,), (job_id, lease_s)))
