"""A correct alternative: fail gives the lease up and retries at once (back to
pending, or to the DLQ at max attempts) instead of leaving it for the next reap."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, what it changes


def fail(r, job_id, attempt, error):
    return bool(lua(r, NOW + HELD + """
    redis.call('HSET', jk, 'last_error', ARGV[3])
    redis.call('ZREM', KEYS[1], ARGV[1])
    if tonumber(redis.call('HGET', jk, 'attempts')) >= 3 then
      redis.call('HSET', jk, 'state', 'dead', 'died_at', now)
      redis.call('RPUSH', KEYS[4], ARGV[1])
    else
      redis.call('RPUSH', KEYS[3], ARGV[1])
    end
    return 1""", (INFLIGHT, JOB, PENDING, DLQ), (job_id, attempt, error)))
