"""Broken on purpose: extend revives the lease its own fail gave up."""
# It checks that a lease exists, not that it is live, so a heartbeat after
# the attempt's own fail puts the job back in flight.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: the failed lease (deadline 0) still exists, so the heartbeat thread,
    # not yet told of the fail, pushes it out again: reap no longer retries it
    return bool(lua(r, NOW + """
    local jk = KEYS[2] .. ARGV[1]
    if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
    if tonumber(redis.call('HGET', jk, 'attempts')) ~= tonumber(ARGV[2]) then
      return 0
    end
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, lease_s)))
