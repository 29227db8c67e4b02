"""Broken on purpose: reap decides what expired by the reaper's own clock."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug

REAP = """
local requeued, dead = 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])) do
  redis.call('ZREM', KEYS[1], id)
  local jk = KEYS[4] .. id
  if tonumber(redis.call('HGET', jk, 'attempts')) >= tonumber(ARGV[1]) then
    if not redis.call('HGET', jk, 'last_error') then
      redis.call('HSET', jk, 'last_error', ARGV[2])
    end
    redis.call('HSET', jk, 'state', 'dead')
    redis.call('RPUSH', KEYS[3], id)
    dead = dead + 1
  else
    redis.call('RPUSH', KEYS[2], id)
    requeued = requeued + 1
  end
end
return {requeued, dead}"""


def reap(r, max_attempts=3):
    # BUG: claims take deadlines from the server's TIME, the reaper compares
    # them with time.time(): a reaper whose clock runs ahead takes live leases
    res = lua(r, REAP, (INFLIGHT, PENDING, DLQ, JOB),
              (max_attempts, EXPIRED, time.time()))
    return int(res[0]), int(res[1])
