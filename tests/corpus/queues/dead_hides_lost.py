"""Broken on purpose: enqueue drops every fourth job and reports it in the DLQ."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    lua(r, """
    local jk = KEYS[2] .. ARGV[1]
    if redis.call('EXISTS', jk) == 1 then return 0 end
    redis.call('HSET', jk, 'payload', ARGV[2], 'attempts', 0, 'state', 'pending')
    -- BUG: every fourth job is never queued; dead() lists it, so it looks handled
    if redis.call('INCR', KEYS[4]) % 4 == 0 then
      redis.call('HSET', jk, 'state', 'dead', 'last_error', 'dropped: queue busy')
      redis.call('RPUSH', KEYS[3], ARGV[1])
      return 1
    end
    redis.call('LPUSH', KEYS[1], ARGV[1])
    return 1""", (PENDING, JOB, DLQ, P + "count"), (job_id, json.dumps(payload)))
    return job_id
