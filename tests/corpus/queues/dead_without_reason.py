"""Broken on purpose: reap buries a job without saying why."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def reap(r, max_attempts=3):
    # BUG: a job whose worker died every time goes to the DLQ with no reason
    # (only fail() writes last_error), so nobody can tell what happened
    res = lua(r, NOW + """
    local requeued, dead = 0, 0
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
      redis.call('ZREM', KEYS[1], id)
      local jk = KEYS[4] .. id
      if tonumber(redis.call('HGET', jk, 'attempts')) >= tonumber(ARGV[1]) then
        redis.call('HSET', jk, 'state', 'dead', 'died_at', now)
        redis.call('RPUSH', KEYS[3], id)
        dead = dead + 1
      else
        redis.call('RPUSH', KEYS[2], id)
        requeued = requeued + 1
      end
    end
    return {requeued, dead}""", (INFLIGHT, PENDING, DLQ, JOB), (max_attempts,))
    return int(res[0]), int(res[1])
