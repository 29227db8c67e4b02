"""Broken on purpose: only fail() counts an attempt; a killed worker never does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def fail(r, job_id, attempt, error):
    return bool(lua(r, HELD + """
    redis.call('HSET', jk, 'last_error', ARGV[3])
    redis.call('HINCRBY', jk, 'failures', 1)
    redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, error)))


def reap(r, max_attempts=3):
    res = lua(r, NOW + """
    local requeued, dead = 0, 0
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
      redis.call('ZREM', KEYS[1], id)
      local jk = KEYS[4] .. id
      -- BUG: counts failures reported by fail(), not claims; a worker that
      -- dies on the job reports nothing, so the job comes back forever
      if tonumber(redis.call('HGET', jk, 'failures') or '0')
         >= tonumber(ARGV[1]) then
        if not redis.call('HGET', jk, 'last_error') then
          redis.call('HSET', jk, 'last_error', ARGV[2])
        end
        redis.call('HSET', jk, 'state', 'dead', 'died_at', now)
        redis.call('RPUSH', KEYS[3], id)
        dead = dead + 1
      else
        redis.call('RPUSH', KEYS[2], id)
        requeued = requeued + 1
      end
    end
    return {requeued, dead}""", (INFLIGHT, PENDING, DLQ, JOB), (max_attempts, EXPIRED))
    return int(res[0]), int(res[1])
