"""Broken on purpose: ack checks the lease exists, not that it is live."""
# An attempt that failed can still ack: the job is done without its retry.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def ack(r, job_id, attempt):
    # BUG: fail leaves the lease in place with a deadline of 0 for reap to
    # retry; ZSCORE finds it, so the failed attempt's ack is taken as done
    return bool(lua(r, """
    local jk = KEYS[2] .. ARGV[1]
    if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    if tonumber(redis.call('HGET', jk, 'attempts')) ~= tonumber(ARGV[2]) then
      return 0
    end
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('HSET', jk, 'state', 'done')
    return 1""", (INFLIGHT, JOB), (job_id, attempt)))
