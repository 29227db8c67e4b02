"""A small correct queue (another key layout than handson.q): the variants' base."""

import json
import os
import uuid

P = "{cq}:"
PENDING, INFLIGHT, DLQ, JOB = P + "pending", P + "inflight", P + "dlq", P + "job:"
EXPIRED = "lease expired (worker died or was too slow)"
NOW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
"""


def lua(r, src, keys, args):
    return r.eval(src, len(keys), *keys, *args)


class QueueFull(Exception):
    """Enqueue refused: QUEUE_MAX jobs are pending."""


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", 100_000))
    res = lua(r, """
    local jk = KEYS[2] .. ARGV[1]
    if redis.call('EXISTS', jk) == 1 then return 0 end
    if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
    redis.call('HSET', jk, 'payload', ARGV[2], 'attempts', 0, 'state', 'pending')
    redis.call('LPUSH', KEYS[1], ARGV[1])
    return 1""", (PENDING, JOB), (job_id, json.dumps(payload), bound))
    if res == -1:
        raise QueueFull(f"{bound} jobs pending")
    return job_id


def claim(r, lease_s):
    res = lua(r, NOW + """
    local id = redis.call('RPOP', KEYS[1])
    if not id then return false end
    local n = redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), id)
    return {id, redis.call('HGET', KEYS[3] .. id, 'payload'), n}""",
              (PENDING, INFLIGHT, JOB), (lease_s,))
    if not res:
        return None
    return res[0], json.loads(res[1] or "{}"), int(res[2])


# KEYS: inflight job-prefix; ARGV: job_id attempt. Fenced: lease held by attempt,
# and live: a deadline of 0 is a lease given up by fail, waiting for reap.
HELD = """
local jk = KEYS[2] .. ARGV[1]
local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease or tonumber(lease) == 0 then return 0 end
if tonumber(redis.call('HGET', jk, 'attempts')) ~= tonumber(ARGV[2]) then return 0 end
"""


def ack(r, job_id, attempt):
    return bool(lua(r, HELD + """
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('HSET', jk, 'state', 'done')
    return 1""", (INFLIGHT, JOB), (job_id, attempt)))


def extend(r, job_id, attempt, lease_s):
    return bool(lua(r, NOW + HELD + """
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, lease_s)))


def fail(r, job_id, attempt, error):
    return bool(lua(r, HELD + """
    redis.call('HSET', jk, 'last_error', ARGV[3])
    redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])
    return 1""", (INFLIGHT, JOB), (job_id, attempt, error)))


def reap(r, max_attempts=3):
    res = lua(r, NOW + """
    local requeued, dead = 0, 0
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
      redis.call('ZREM', KEYS[1], id)
      local jk = KEYS[4] .. id
      if tonumber(redis.call('HGET', jk, 'attempts')) >= tonumber(ARGV[1]) then
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


def dead(r):
    out = []
    for job_id in r.lrange(DLQ, 0, -1):
        attempts, error = r.hmget(JOB + job_id, "attempts", "last_error")
        out.append((job_id, int(attempts or 0), error or ""))
    return out


def reset(r):
    r.delete(PENDING, INFLIGHT, DLQ, *r.keys(JOB + "*"))
