"""A correct queue whose leases are keys with a TTL: Redis itself ends them.

A claim sets `lease:<id>` to its attempt number with PX = the lease; extend
renews the TTL only while the key still holds the caller's attempt; reap looks
at the jobs in flight (a set) and moves those whose lease key is gone. So a
lease that ran out is over at once, even before a reap: its ack or extend is
refused (the reference queue still accepts them until the reap). Every step is
one Lua script; the server's clock times every TTL.
"""

import json
import os
import uuid

P = "{tq}:"
PENDING, INFLIGHT, DLQ, DONE = P + "pending", P + "inflight", P + "dlq", P + "done"
JOB, LEASE = P + "job:", P + "lease:"
EXPIRED = "lease expired (worker died or was too slow)"
KEYS = (PENDING, INFLIGHT, DLQ, DONE, JOB, LEASE)
HEAD = """
redis.replicate_commands()
local PEND, INF, DLQ, DONE, J, L = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function holds(id, attempt)
  return redis.call('GET', L .. id) == tostring(attempt)
end
"""


class QueueFull(Exception):
    """Enqueue refused: QUEUE_MAX jobs are pending."""


def _run(r, body, *args):
    return r.eval(HEAD + body, len(KEYS), *KEYS, *args)


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _ms(seconds):
    return max(1, round(seconds * 1000))


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", 100_000))
    res = _run(r, """
    local id = ARGV[1]
    if redis.call('EXISTS', J .. id) == 1 or redis.call('ZSCORE', DONE, id) then
      return 0
    end
    if redis.call('LLEN', PEND) >= tonumber(ARGV[3]) then return -1 end
    redis.call('HSET', J .. id, 'payload', ARGV[2], 'attempts', 0)
    redis.call('LPUSH', PEND, id)
    return 1""", job_id, json.dumps(payload), bound)
    if res == -1:
        raise QueueFull(f"{bound} jobs pending")
    return job_id


def claim(r, lease_s):
    row = _run(r, """
    local id = redis.call('RPOP', PEND)
    if not id then return false end
    local n = redis.call('HINCRBY', J .. id, 'attempts', 1)
    redis.call('HDEL', J .. id, 'failed')
    redis.call('SET', L .. id, n, 'PX', ARGV[1])
    redis.call('SADD', INF, id)
    return {id, redis.call('HGET', J .. id, 'payload'), n}""", _ms(lease_s))
    if not row:
        return None
    return _s(row[0]), json.loads(row[1] or "{}"), int(row[2])


def ack(r, job_id, attempt):
    return bool(_run(r, """
    if not holds(ARGV[1], ARGV[2]) then return 0 end
    redis.call('DEL', L .. ARGV[1], J .. ARGV[1])
    redis.call('SREM', INF, ARGV[1])
    redis.call('ZADD', DONE, now, ARGV[1])
    return 1""", job_id, int(attempt)))


def extend(r, job_id, attempt, lease_s):
    return bool(_run(r, """
    if not holds(ARGV[1], ARGV[2]) then return 0 end
    redis.call('PEXPIRE', L .. ARGV[1], ARGV[3])
    return 1""", job_id, int(attempt), _ms(lease_s)))


def fail(r, job_id, attempt, error):
    return bool(_run(r, """
    if not holds(ARGV[1], ARGV[2]) then return 0 end
    redis.call('DEL', L .. ARGV[1])
    redis.call('HSET', J .. ARGV[1], 'error', ARGV[3], 'failed', 1)
    return 1""", job_id, int(attempt), error))


def reap(r, max_attempts=3):
    requeued, dead_n = _run(r, """
    local requeued, dead = 0, 0
    for _, id in ipairs(redis.call('SMEMBERS', INF)) do
      if redis.call('EXISTS', L .. id) == 0 then
        redis.call('SREM', INF, id)
        if redis.call('HGET', J .. id, 'failed') then
          redis.call('HDEL', J .. id, 'failed')
        else
          redis.call('HSET', J .. id, 'error', ARGV[2])
        end
        if tonumber(redis.call('HGET', J .. id, 'attempts')) >= tonumber(ARGV[1]) then
          redis.call('ZADD', DLQ, now, id)
          dead = dead + 1
        else
          redis.call('LPUSH', PEND, id)
          requeued = requeued + 1
        end
      end
    end
    return {requeued, dead}""", int(max_attempts), EXPIRED)
    return int(requeued), int(dead_n)


def dead(r):
    out = []
    for job_id in r.zrange(DLQ, 0, -1):
        attempts, error = r.hmget(JOB + _s(job_id), "attempts", "error")
        out.append((_s(job_id), int(attempts or 0), _s(error or b"")))
    return out
