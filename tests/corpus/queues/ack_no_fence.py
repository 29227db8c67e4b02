"""Broken on purpose: ack removes the lease without checking the attempt."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def ack(r, job_id, attempt):
    # BUG: no fencing; any attempt (a zombie's too) removes the current lease
    return bool(lua(r, """
    local jk = KEYS[2] .. ARGV[1]
    if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
    redis.call('HSET', jk, 'state', 'done')
    return 1""", (INFLIGHT, JOB), (job_id, attempt)))
