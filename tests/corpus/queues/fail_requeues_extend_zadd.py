"""Broken on purpose: fail requeues at once; extend re-adds it (ZADD, no XX)."""
# A heartbeat after the fail puts the job in flight and pending at once.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def fail(r, job_id, attempt, error):
    return bool(lua(r, HELD + """
    redis.call('HSET', jk, 'last_error', ARGV[3])
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('RPUSH', KEYS[3], ARGV[1])
    return 1""", (INFLIGHT, JOB, PENDING), (job_id, attempt, error)))


def extend(r, job_id, attempt, lease_s):
    return bool(lua(r, NOW + """
    local jk = KEYS[2] .. ARGV[1]
    if tonumber(redis.call('HGET', jk, 'attempts')) ~= tonumber(ARGV[2]) then
      return 0
    end
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, lease_s)))
