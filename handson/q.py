"""The reference queue: leases, acks, retries and a dead-letter queue on Redis.

The seed's `q.py` with its questions answered. Every state change is ONE Lua
script, so it is one atomic step on the server and one round trip:

- `enqueue` is idempotent on `job_id`: an id that is pending, in flight, dead
  or done (see retention below) is one job, and enqueueing it again is a no-op
  that returns the id. It is bounded: past `QUEUE_MAX` pending jobs it raises
  `QueueFull` (backpressure at the door, not an ever-growing buffer).
- `claim` pops a job, bumps its attempt number and records its lease deadline
  together. The attempt number is the fencing token: `ack`, `extend` and `fail`
  compare the caller's attempt with the job's current one inside the script, so
  a zombie (a worker whose lease expired and was handed on) is refused while
  the new owner succeeds.
- `extend` only moves a deadline that still exists (the `ZADD XX` idea): once
  `reap` has taken a lease away, a late heartbeat cannot bring it back.
- `reap` moves every expired lease back to pending, or to the DLQ once the job
  has used `max_attempts` attempts. A worker that died (its lease ran out, no
  `fail`) has used its attempt too, so a poison job that kills its worker still
  reaches the DLQ, with the reason "lease expired (worker died or was too slow)".
- Deadlines use the Redis server's clock (`TIME`), never the worker's.

Choices worth knowing. The bound counts pending jobs only (what piles up when
producers outrun consumers); re-enqueueing a known id never raises. A lease
that expired but was not reaped yet still belongs to its attempt (nobody else
holds the job), so its ack or extend is accepted; after `fail` the attempt can
neither ack nor extend. A retried job goes to the back of the line, so a
poison job cannot hog the head. `reap` moves at most REAP_LIMIT leases per
call, to keep each script short; call it again while it returns work.

Done retention. A finished job leaves a done marker (its id and when it was
acked) so the same document saved again is still one job. Markers live for
`QUEUE_DONE_TTL_S` seconds (default one day) and are pruned by reap, up to
REAP_LIMIT expired markers per call (not on ack or enqueue: those are the hot
path, and a day's markers expiring at once must not make one enqueue slow).
Workers reap every half second, so the memory of what was done stays bounded
(the window's acks plus what the reaps since have not reached); an id
enqueued after its marker expired is a new job (with attempts from 1 again).
Idempotency the queue cannot promise beyond that window belongs in the sink
(the idempotent write).

Operators' commands (on REDIS_URL, or a private server for a quick look):

    python -m handson.q stats        # depths and the oldest pending job's age
    python -m handson.q dead         # the DLQ with reasons and times of death
    python -m handson.q redrive      # DLQ back to pending

Keys. All keys of a queue share its hash tag (`{q}`, or `{name}` for the
`queue=name` that every function takes), and every key a script touches is
passed in KEYS (job data lives in one per-queue hash with a field per job
and fact, not in per-job keys: claim cannot know its job's key in advance),
so the scripts run unchanged on Redis Cluster. Only Redis 6.2 commands are
used.

Speed. A job costs the server two scripts of five commands each (claim, ack);
`ack_and_claim` does both in one script and one round trip, for a busy worker
(the next job's lease starts before the worker is ready for it); the batched
scripts do the same work for a whole batch in a few commands. See
`python -m handson.bench` for what that buys against a PING loop.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
import uuid
from typing import NamedTuple

import redis

from handson.redis_server import cli_redis, connect, redis_url


class Keys(NamedTuple):
    """One queue's keys, all under the hash tag {name}: one slot, one shard."""

    pending: str    # list: LPUSH to enter, RPOP to claim (FIFO)
    inflight: str   # zset: job_id -> lease deadline (ms); 0 = failed
    jobs: str       # hash: one field per job and fact, named below
    waiting: str    # zset: requeued pending job_id -> enqueue time
    dlq: str        # zset: job_id -> time of death (ms)
    done: str       # zset: job_id -> time of ack (ms), for retention


@functools.lru_cache(maxsize=4096)
def keys(queue: str = "q") -> Keys:
    """The keys of the queue named `queue` (every function takes `queue=`).

    Many queues on a Redis Cluster are many names: each is one hash tag, so
    each lives whole on one shard and its scripts stay single-slot.
    """
    if not queue or "{" in queue or "}" in queue:
        raise ValueError(f"queue name {queue!r} must be non-empty, without braces")
    return Keys(*(f"{{{queue}}}:{field}" for field in Keys._fields))


TAG = "{q}"
KEYS = keys()                   # the default queue "q": {q}:pending, ...
PENDING, INFLIGHT, JOBS, WAITING, DLQ, DONE = KEYS
# Fields of JOBS, each a prefix before the job id (the prefix says what it is,
# so no id can collide with another's field):
#   p:<id> payload JSON (until ack)         a:<id> attempts so far (only grows)
#   t:<id> when it (re)entered the queue    b:<id> attempts when last redriven
#   e:<id> last error
# One hash rather than one per fact: an ack deletes a job's fields in one call.

DEFAULT_MAX_PENDING = 100_000
DEFAULT_DONE_TTL_S = 24 * 3600
LEASE_EXPIRED = "lease expired (worker died or was too slow)"
REAP_LIMIT = 1000               # expired leases handled per reap call (bounded work)


class QueueFull(Exception):
    """Enqueue refused: the pending list is at its bound. Retry later (503)."""


# Every script that needs the time starts with this: effects replication
# (needed on 6.2 for writes after TIME) and `now` in milliseconds from the
# server's clock.
_NOW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# For the batched scripts: `many` sends one command for a whole list of
# arguments (in slices: Lua can unpack only so many values at once) and joins
# the replies, so a batch costs a few calls, not a few per job.
_MANY = """
local function many(cmd, key, args)
  if #args == 0 then return {} end
  if #args <= 1000 then return redis.call(cmd, key, unpack(args)) end
  local res = {}
  for i = 1, #args, 1000 do
    local part = redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
    if type(part) == 'table' then
      for j = 1, #part do res[#res + 1] = part[j] end
    end
  end
  return res
end
"""

_ENQUEUE = _NOW + """
-- KEYS: pending jobs done
-- ARGV: job_id payload max_pending done_ttl_ms
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[2], 'p:' .. id) == 1 then return 0 end
local done = redis.call('ZSCORE', KEYS[3], id)
if done and tonumber(done) >= now - tonumber(ARGV[4]) then return 0 end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
if done then redis.call('ZREM', KEYS[3], id) end   -- its marker had expired
redis.call('HSET', KEYS[2], 'p:' .. id, ARGV[2], 't:' .. id, now)
redis.call('LPUSH', KEYS[1], id)
return 1
"""

# Claim and ack as Lua functions, so the fused script below runs the very same
# steps as the two it fuses. `now` is the caller's (one TIME per script).
_CLAIM_FN = """
-- the next pending job with a lease to now + lease_ms: {id, payload, attempt}
local function claim(pending, inflight, jobs, waiting, lease_ms, now)
  local id = redis.call('RPOP', pending)
  if not id then return false end
  local n = redis.call('HINCRBY', jobs, 'a:' .. id, 1)
  redis.call('ZADD', inflight, now + tonumber(lease_ms), id)
  if n > 1 then redis.call('ZREM', waiting, id) end   -- requeued: waits no more
  return {id, redis.call('HGET', jobs, 'p:' .. id), n}
end
"""

_ACK_FN = """
-- finish attempt `attempt` of job `id`: 1, or 0 when it no longer holds it
local function ack(inflight, jobs, done, id, attempt, now)
  local job = redis.call('HMGET', jobs, 'a:' .. id, 'f:' .. id)
  if tonumber(job[1]) ~= tonumber(attempt)           -- the fence: still this attempt
     or job[2]                                       -- not failed
     or redis.call('ZREM', inflight, id) == 0 then   -- and not reaped
    return 0
  end
  if tonumber(attempt) == 1 then   -- the usual case: no error, never redriven
    redis.call('HDEL', jobs, 'p:' .. id, 'a:' .. id, 't:' .. id)
  else                             -- an error (e:) or a redrive (b:) came first
    redis.call('HDEL', jobs, 'p:' .. id, 'a:' .. id, 't:' .. id, 'b:' .. id,
               'e:' .. id)
  end
  redis.call('ZADD', done, now, id)
  return 1
end
"""

_CLAIM = _NOW + _CLAIM_FN + """
-- KEYS: pending inflight jobs waiting
-- ARGV: lease_ms
return claim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], now)
"""

_ACK = _NOW + _ACK_FN + """
-- KEYS: inflight jobs done
-- ARGV: job_id attempt
return ack(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], now)
"""

# A busy worker's one round trip per job (BullMQ's moveToFinished does the
# same): the ack of the job it finished and the claim of the next, one atomic
# step. The ack is judged alone: a refused ack still claims (the worker is
# free either way). Reply {acked, id, payload, attempt}, or {acked} when
# nothing is pending.
_ACK_AND_CLAIM = _NOW + _ACK_FN + _CLAIM_FN + """
-- KEYS: inflight jobs done pending waiting
-- ARGV: job_id attempt lease_ms
local acked = ack(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], now)
local job = claim(KEYS[4], KEYS[1], KEYS[2], KEYS[5], ARGV[3], now)
if not job then return {acked} end
return {acked, job[1], job[2], job[3]}
"""

# Up to 128 short members, Redis keeps a zset as a packed list where each
# lookup scans (and parses every score), so a batch of 100 leases would cost
# O(n^2). A member over 64 bytes switches the key to the skiplist, which it
# keeps until the key is gone: claim_batch adds such a member first and
# removes it in the same script (unless a job has that very id), so no one
# ever sees it.
_CLAIM_BATCH = _NOW + _MANY + """
-- KEYS: pending inflight jobs waiting
-- ARGV: lease_ms n
-- Replies id, payload, attempt for each job in one flat list. Attempts are
-- read and written for the whole batch at once (an id is on the pending list
-- at most once, so this is HINCRBY per job in two calls).
local ids = redis.call('RPOP', KEYS[1], ARGV[2])
if not ids then return {} end
local deadline = now + tonumber(ARGV[1])
local wide = string.rep('~', 65)
local widen = #ids > 1 and not redis.call('ZSCORE', KEYS[2], wide)
local fields, leases, again = {}, {}, {}
for i, id in ipairs(ids) do
  fields[2 * i - 1], fields[2 * i] = 'a:' .. id, 'p:' .. id
  if id == wide then widen = false end
end
local job = many('HMGET', KEYS[3], fields)
local counts, out = {}, {}
for i, id in ipairs(ids) do
  local attempt = (tonumber(job[2 * i - 1]) or 0) + 1
  if attempt > 1 then again[#again + 1] = id end
  counts[2 * i - 1], counts[2 * i] = fields[2 * i - 1], attempt
  if widen and i == 1 then leases[1], leases[2] = 0, wide end
  leases[#leases + 1] = deadline
  leases[#leases + 1] = id
  out[3 * i - 2], out[3 * i - 1], out[3 * i] = id, job[2 * i], attempt
end
many('HSET', KEYS[3], counts)
many('ZADD', KEYS[2], leases)
if widen then redis.call('ZREM', KEYS[2], wide) end
many('ZREM', KEYS[4], again)
return out
"""

_ACK_BATCH = _NOW + _MANY + """
-- KEYS: inflight jobs done
-- ARGV: job_id attempt pairs; each pair is fenced on its own
local ids, fields = {}, {}
for i = 1, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  fields[#fields + 1] = 'a:' .. ARGV[i]
end
local attempts = many('HMGET', KEYS[2], fields)
local leases = many('ZMSCORE', KEYS[1], ids)       -- 0: failed, false: reaped
local out, seen, gone, drop, marks = {}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  out[i] = 0
  if leases[i] and tonumber(leases[i]) > 0 and not seen[id]
     and tonumber(attempts[i]) == tonumber(ARGV[2 * i]) then
    seen[id] = true
    gone[#gone + 1] = id
    local d = #drop
    drop[d + 1], drop[d + 2], drop[d + 3] = 'p:' .. id, 'a:' .. id, 't:' .. id
    drop[d + 4], drop[d + 5] = 'b:' .. id, 'e:' .. id
    marks[#marks + 1] = now
    marks[#marks + 1] = id
    out[i] = 1
  end
end
many('ZREM', KEYS[1], gone)
many('HDEL', KEYS[2], drop)
many('ZADD', KEYS[3], marks)
return table.concat(out)                           -- '1' acked, '0' refused
"""

_EXTEND = _NOW + """
-- KEYS: inflight jobs      ARGV: job_id attempt lease_ms
local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease or tonumber(lease) == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

_FAIL = """
-- KEYS: inflight jobs      ARGV: job_id attempt error
local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease or tonumber(lease) == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[2], 'e:' .. ARGV[1], ARGV[3], 'f:' .. ARGV[1], 1)
redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])  -- expired now: reap decides
return 1
"""

_REAP = _NOW + """
-- KEYS: inflight pending jobs waiting dlq done
-- ARGV: max_attempts limit lease_expired_message done_ttl_ms
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                           'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local requeued, dead = 0, 0
for i = 1, #expired, 2 do
  local id, lease = expired[i], tonumber(expired[i + 1])
  redis.call('ZREM', KEYS[1], id)
  if lease ~= 0 then redis.call('HSET', KEYS[3], 'e:' .. id, ARGV[3])
  else redis.call('HDEL', KEYS[3], 'f:' .. id) end        -- failed: the flag goes
  local job = redis.call('HMGET', KEYS[3], 'a:' .. id, 'b:' .. id, 't:' .. id)
  local used = (tonumber(job[1]) or 0) - (tonumber(job[2]) or 0)
  if used >= tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[5], now, id)
    dead = dead + 1
  else
    redis.call('LPUSH', KEYS[2], id)
    redis.call('ZADD', KEYS[4], job[3] or now, id)
    requeued = requeued + 1
  end
end
-- forget expired done markers, as many as leases at most (bounded work)
local cutoff = '(' .. (now - tonumber(ARGV[4]))
local old = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', cutoff,
                       'LIMIT', 0, tonumber(ARGV[2]))
if #old > 0 then redis.call('ZREM', KEYS[6], unpack(old)) end
return {requeued, dead}
"""

_DEAD = """
-- KEYS: dlq jobs
local ids = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  local job = redis.call('HMGET', KEYS[2], 'a:' .. id, 'e:' .. id)
  out[#out + 1] = {id, tonumber(job[1]) or 0, job[2] or '', ids[i + 1]}
end
return out
"""

_REDRIVE = _NOW + """
-- KEYS: dlq pending jobs
-- A redriven job re-enters now, in order, so it needs no WAITING entry.
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  redis.call('HSET', KEYS[3], 'b:' .. id, redis.call('HGET', KEYS[3], 'a:' .. id) or 0,
             't:' .. id, now)
  redis.call('LPUSH', KEYS[2], id)
end
redis.call('DEL', KEYS[1])
return #ids
"""

# The oldest pending job. Jobs enter the pending list in the order of their
# enqueue times, except the ones reap puts back (those keep their first time,
# and are in WAITING). So the oldest is either the list's tail or WAITING's
# first: if the tail was requeued, every job behind it entered later still.
_STATS = """
-- KEYS: pending inflight dlq waiting done jobs
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local age = -1
local tail = redis.call('LINDEX', KEYS[1], -1)
if tail then
  local oldest = tonumber(redis.call('HGET', KEYS[6], 't:' .. tail)) or now
  local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if #first > 0 then oldest = math.min(oldest, tonumber(first[2])) end
  age = now - oldest
end
return {redis.call('LLEN', KEYS[1]), redis.call('ZCARD', KEYS[2]),
        redis.call('ZCARD', KEYS[3]), age, redis.call('ZCARD', KEYS[5])}
"""


class _Script:
    """A Lua script run by EVALSHA (one round trip), loaded on first NOSCRIPT.

    The sha, the key count and the key names are encoded once per key tuple:
    redis-py packs every argument in Python, and bytes are the cheapest kind.
    """

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._heads: dict[tuple[str, ...], tuple[bytes, ...]] = {}

    def __call__(self, r: redis.Redis, keys: tuple[str, ...], args=()):
        head = self._heads.get(keys)
        if head is None:
            head = self._heads[keys] = (self.sha.encode(), str(len(keys)).encode(),
                                        *(k.encode() for k in keys))
        try:
            return r.evalsha(*head, *args)
        except redis.exceptions.NoScriptError:
            r.script_load(self.source)
            return r.evalsha(*head, *args)


_enqueue = _Script(_ENQUEUE)
_claim = _Script(_CLAIM)
_ack = _Script(_ACK)
_ack_and_claim = _Script(_ACK_AND_CLAIM)
_claim_batch = _Script(_CLAIM_BATCH)
_ack_batch = _Script(_ACK_BATCH)
_extend = _Script(_EXTEND)
_fail = _Script(_FAIL)
_reap = _Script(_REAP)
_dead = _Script(_DEAD)
_redrive = _Script(_REDRIVE)
_stats = _Script(_STATS)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _done_ttl_ms() -> int:
    return _ms(float(os.environ.get("QUEUE_DONE_TTL_S", DEFAULT_DONE_TTL_S)))


def enqueue(r: redis.Redis, payload: dict, job_id: str | None = None, *,
            max_pending: int | None = None, queue: str = "q") -> str:
    """Add a job once; the same job_id again is the same job. Raises QueueFull."""
    k = keys(queue)
    job_id = job_id or uuid.uuid4().hex
    bound = max_pending if max_pending is not None else int(
        os.environ.get("QUEUE_MAX", DEFAULT_MAX_PENDING))
    res = _enqueue(r, (k.pending, k.jobs, k.done),
                   (job_id, json.dumps(payload), bound, _done_ttl_ms()))
    if res == -1:
        raise QueueFull(f"queue is full ({bound} jobs pending); retry later "
                        "or raise QUEUE_MAX")
    return job_id


def claim_batch(r: redis.Redis, lease_s: float, n: int, *, queue: str = "q"
                ) -> list[tuple[str, dict, int]]:
    """Up to n jobs in one script call, each with its own attempt number."""
    k = keys(queue)
    if n < 1:
        return []
    rows = _claim_batch(r, (k.pending, k.inflight, k.jobs, k.waiting),
                        (_ms(lease_s), int(n)))
    return [(_text(i), json.loads(p) if p else {}, int(a))
            for i, p, a in zip(rows[::3], rows[1::3], rows[2::3], strict=True)]


def claim(r: redis.Redis, lease_s: float, *, queue: str = "q"
          ) -> tuple[str, dict, int] | None:
    """The next job with a lease of lease_s seconds: (job_id, payload, attempt)."""
    k = keys(queue)
    row = _claim(r, (k.pending, k.inflight, k.jobs, k.waiting), (_ms(lease_s),))
    if not row:
        return None
    i, p, a = row
    return _text(i), json.loads(p) if p else {}, int(a)


def ack_batch(r: redis.Redis, items: list[tuple[str, int]], *, queue: str = "q"
              ) -> list[bool]:
    """Ack many (job_id, attempt) pairs in one script call; each fenced alone."""
    k = keys(queue)
    if not items:
        return []
    args = []
    for job_id, attempt in items:
        args += (job_id, int(attempt))
    res = _ack_batch(r, (k.inflight, k.jobs, k.done), args)
    return [c == "1" for c in _text(res)]


def ack(r: redis.Redis, job_id: str, attempt: int, *, queue: str = "q") -> bool:
    """Finish the job. False: this attempt no longer holds the lease (a zombie)."""
    k = keys(queue)
    return bool(_ack(r, (k.inflight, k.jobs, k.done), (job_id, int(attempt))))


def ack_and_claim(r: redis.Redis, job_id: str, attempt: int, lease_s: float, *,
                  queue: str = "q") -> tuple[bool, tuple[str, dict, int] | None]:
    """Ack the job and claim the next in one round trip: (acked, next job or None).

    The ack is `ack`'s, fenced the same; the claim is `claim`'s, and happens
    even when the ack is refused. The next job's lease starts now: a worker
    that dies before it reads the reply holds that job until its lease ends.
    """
    k = keys(queue)
    row = _ack_and_claim(r, (k.inflight, k.jobs, k.done, k.pending, k.waiting),
                         (job_id, int(attempt), _ms(lease_s)))
    if len(row) == 1:
        return bool(row[0]), None
    acked, i, p, a = row
    return bool(acked), (_text(i), json.loads(p) if p else {}, int(a))


def extend(r: redis.Redis, job_id: str, attempt: int, lease_s: float, *,
           queue: str = "q") -> bool:
    """Heartbeat: push the deadline back. False: the lease is gone, stop working."""
    k = keys(queue)
    return bool(_extend(r, (k.inflight, k.jobs), (job_id, int(attempt), _ms(lease_s))))


def fail(r: redis.Redis, job_id: str, attempt: int, error: str, *,
         queue: str = "q") -> bool:
    """Record the error and expire the lease now; the next reap retries or buries."""
    k = keys(queue)
    return bool(_fail(r, (k.inflight, k.jobs), (job_id, int(attempt), error)))


def reap(r: redis.Redis, max_attempts: int = 3, *, queue: str = "q"
         ) -> tuple[int, int]:
    """Expired leases back to pending, or to the DLQ: (requeued, dead)."""
    k = keys(queue)
    requeued, dead_n = _reap(
        r, (k.inflight, k.pending, k.jobs, k.waiting, k.dlq, k.done),
        (int(max_attempts), REAP_LIMIT, LEASE_EXPIRED, _done_ttl_ms()))
    return int(requeued), int(dead_n)


def dead_details(r: redis.Redis, *, queue: str = "q") -> list[dict]:
    """The DLQ, oldest death first, with the time of death (server clock, s)."""
    k = keys(queue)
    rows = _dead(r, (k.dlq, k.jobs))
    return [{"job_id": _text(i), "attempts": int(a), "last_error": _text(e),
             "died_at": float(_text(t)) / 1000} for i, a, e, t in rows]


def dead(r: redis.Redis, *, queue: str = "q") -> list[tuple[str, int, str]]:
    """The DLQ: (job_id, attempts, last_error), oldest death first."""
    return [(d["job_id"], d["attempts"], d["last_error"])
            for d in dead_details(r, queue=queue)]


def redrive(r: redis.Redis, *, queue: str = "q") -> int:
    """Move every dead job back to pending with a fresh attempt budget.

    Attempt numbers keep growing (they are fencing tokens); only the budget
    counted against max_attempts starts again.
    """
    k = keys(queue)
    return int(_redrive(r, (k.dlq, k.pending, k.jobs)))


def stats(r: redis.Redis, *, queue: str = "q") -> dict:
    """Depths and lag in one call: the numbers to alarm on."""
    k = keys(queue)
    pending, inflight, dead_n, age_ms, done = _stats(
        r, (k.pending, k.inflight, k.dlq, k.waiting, k.done, k.jobs))
    return {"pending": int(pending), "inflight": int(inflight), "dead": int(dead_n),
            "oldest_pending_age_s": max(0, int(age_ms)) / 1000,
            "done": int(done)}


def status(r: redis.Redis, job_id: str, *, queue: str = "q") -> str | None:
    """'pending', 'inflight', 'dead', 'done' or None (never seen, or forgotten)."""
    k = keys(queue)
    p = r.pipeline(transaction=False)
    p.zscore(k.inflight, job_id)
    p.zscore(k.dlq, job_id)
    p.hexists(k.jobs, f"p:{job_id}")
    p.zscore(k.done, job_id)
    inflight, dead_at, known, done_at = p.execute()
    if inflight is not None:
        return "inflight"
    if dead_at is not None:
        return "dead"
    if known:
        return "pending"
    return "done" if done_at is not None else None


def reset(r: redis.Redis, *, queue: str = "q") -> None:
    """Delete this queue's keys and nothing else."""
    k = keys(queue)
    r.delete(*k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Look at or redrive the reference queue.")
    ap.add_argument("command", choices=("stats", "dead", "redrive"))
    args = ap.parse_args(argv)
    with cli_redis(), redis_url() as url:
        r = connect(url)
        if args.command == "stats":
            print(json.dumps(stats(r)))
        elif args.command == "dead":
            for d in dead_details(r):
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d["died_at"]))
                print(f"{d['job_id']}\tattempts={d['attempts']}\tdied={when}Z"
                      f"\t{d['last_error']}")
        else:
            print(f"redrove {redrive(r)} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
