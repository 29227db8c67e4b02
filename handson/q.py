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
`QUEUE_DONE_TTL_S` seconds (default one day) and are pruned on ack, so the
memory of what was done stays bounded; an id enqueued after its marker expired
is a new job (with attempts from 1 again). Idempotency the queue cannot promise
beyond that window belongs in the sink (the idempotent write).

Operators' commands (on REDIS_URL, or a private server for a quick look):

    python -m handson.q stats        # depths and the oldest pending job's age
    python -m handson.q dead         # the DLQ with reasons and times of death
    python -m handson.q redrive      # DLQ back to pending

Keys. All keys share the hash tag `{q}` and every key a script touches is
passed in KEYS (job data lives in per-queue hashes keyed by job id, not in
per-job keys), so the scripts run unchanged on Redis Cluster. Only Redis 6.2
commands are used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import uuid

import redis

from handson.redis_server import cli_redis, connect, redis_url

TAG = "{q}"
PENDING = f"{TAG}:pending"      # list: LPUSH to enter, RPOP to claim (FIFO)
INFLIGHT = f"{TAG}:inflight"    # zset: job_id -> lease deadline (ms); 0 = failed
PAYLOAD = f"{TAG}:payload"      # hash: job_id -> payload JSON (until ack)
ATTEMPTS = f"{TAG}:attempts"    # hash: job_id -> attempts so far (only grows)
BASE = f"{TAG}:base"            # hash: job_id -> attempts when last redriven
ERROR = f"{TAG}:error"          # hash: job_id -> last error
ENQUEUED = f"{TAG}:enqueued"    # hash: job_id -> when it (re)entered the queue (ms)
WAITING = f"{TAG}:waiting"      # zset: pending job_id -> enqueue time (for lag)
DLQ = f"{TAG}:dlq"              # zset: job_id -> time of death (ms)
DONE = f"{TAG}:done"            # zset: job_id -> time of ack (ms), for retention
KEYS = (PENDING, INFLIGHT, PAYLOAD, ATTEMPTS, BASE, ERROR, ENQUEUED, WAITING,
        DLQ, DONE)

DEFAULT_MAX_PENDING = 100_000
DEFAULT_DONE_TTL_S = 24 * 3600
LEASE_EXPIRED = "lease expired (worker died or was too slow)"
REAP_LIMIT = 1000               # expired leases handled per reap call (bounded work)


class QueueFull(Exception):
    """Enqueue refused: the pending list is at its bound. Retry later (503)."""


# Every script starts with this: effects replication (needed on 6.2 for writes
# after TIME) and `now` in milliseconds from the server's clock.
_NOW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_ENQUEUE = _NOW + """
-- KEYS: pending payload enqueued waiting done
-- ARGV: job_id payload max_pending done_ttl_ms
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[2], id) == 1 then return 0 end
local done = redis.call('ZSCORE', KEYS[5], id)
if done and tonumber(done) >= now - tonumber(ARGV[4]) then return 0 end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end
if done then redis.call('ZREM', KEYS[5], id) end
redis.call('HSET', KEYS[2], id, ARGV[2])
redis.call('HSET', KEYS[3], id, now)
redis.call('ZADD', KEYS[4], now, id)
redis.call('LPUSH', KEYS[1], id)
return 1
"""

_CLAIM = _NOW + """
-- KEYS: pending inflight payload attempts waiting
-- ARGV: lease_ms n
local deadline = now + tonumber(ARGV[1])
local out = {}
for _ = 1, tonumber(ARGV[2]) do
  local id = redis.call('RPOP', KEYS[1])
  if not id then break end
  local n = redis.call('HINCRBY', KEYS[4], id, 1)
  redis.call('ZADD', KEYS[2], deadline, id)
  redis.call('ZREM', KEYS[5], id)
  out[#out + 1] = {id, redis.call('HGET', KEYS[3], id), n}
end
return out
"""

_ACK = _NOW + """
-- KEYS: inflight payload attempts base error enqueued done
-- ARGV: done_ttl_ms, then job_id attempt pairs
local out = {}
for i = 2, #ARGV, 2 do
  local id, attempt = ARGV[i], tonumber(ARGV[i + 1])
  local lease = redis.call('ZSCORE', KEYS[1], id)
  local ok = 0
  if lease and tonumber(lease) > 0
     and tonumber(redis.call('HGET', KEYS[3], id)) == attempt then
    redis.call('ZREM', KEYS[1], id)
    for k = 2, 6 do redis.call('HDEL', KEYS[k], id) end
    redis.call('ZADD', KEYS[7], now, id)
    ok = 1
  end
  out[#out + 1] = ok
end
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', '(' .. (now - tonumber(ARGV[1])))
return out
"""

_EXTEND = _NOW + """
-- KEYS: inflight attempts      ARGV: job_id attempt lease_ms
local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease or tonumber(lease) == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], ARGV[1])) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1
"""

_FAIL = """
-- KEYS: inflight attempts error      ARGV: job_id attempt error
local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not lease or tonumber(lease) == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[2], ARGV[1])) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[1])  -- expired now: reap decides
return 1
"""

_REAP = _NOW + """
-- KEYS: inflight pending attempts base error enqueued waiting dlq
-- ARGV: max_attempts limit lease_expired_message
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now,
                           'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local requeued, dead = 0, 0
for i = 1, #expired, 2 do
  local id, lease = expired[i], tonumber(expired[i + 1])
  redis.call('ZREM', KEYS[1], id)
  if lease ~= 0 then redis.call('HSET', KEYS[5], id, ARGV[3]) end
  local used = (tonumber(redis.call('HGET', KEYS[3], id)) or 0)
             - (tonumber(redis.call('HGET', KEYS[4], id)) or 0)
  if used >= tonumber(ARGV[1]) then
    redis.call('ZADD', KEYS[8], now, id)
    dead = dead + 1
  else
    redis.call('LPUSH', KEYS[2], id)
    redis.call('ZADD', KEYS[7], redis.call('HGET', KEYS[6], id) or now, id)
    requeued = requeued + 1
  end
end
return {requeued, dead}
"""

_DEAD = """
-- KEYS: dlq attempts error
local ids = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #ids, 2 do
  local id = ids[i]
  out[#out + 1] = {id, tonumber(redis.call('HGET', KEYS[2], id)) or 0,
                   redis.call('HGET', KEYS[3], id) or '', ids[i + 1]}
end
return out
"""

_REDRIVE = _NOW + """
-- KEYS: dlq pending attempts base enqueued waiting
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(ids) do
  redis.call('HSET', KEYS[4], id, redis.call('HGET', KEYS[3], id) or 0)
  redis.call('HSET', KEYS[5], id, now)
  redis.call('ZADD', KEYS[6], now, id)
  redis.call('LPUSH', KEYS[2], id)
end
redis.call('DEL', KEYS[1])
return #ids
"""

_STATS = """
-- KEYS: pending inflight dlq waiting done
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
local age = -1
if #oldest > 0 then age = now - tonumber(oldest[2]) end
return {redis.call('LLEN', KEYS[1]), redis.call('ZCARD', KEYS[2]),
        redis.call('ZCARD', KEYS[3]), age, redis.call('ZCARD', KEYS[5])}
"""


class _Script:
    """A Lua script run by EVALSHA (one round trip), loaded on first NOSCRIPT."""

    def __init__(self, source: str):
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, r: redis.Redis, keys: tuple[str, ...], args=()):
        try:
            return r.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            r.script_load(self.source)
            return r.evalsha(self.sha, len(keys), *keys, *args)


_enqueue = _Script(_ENQUEUE)
_claim = _Script(_CLAIM)
_ack = _Script(_ACK)
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
            max_pending: int | None = None) -> str:
    """Add a job once; the same job_id again is the same job. Raises QueueFull."""
    job_id = job_id or uuid.uuid4().hex
    bound = max_pending if max_pending is not None else int(
        os.environ.get("QUEUE_MAX", DEFAULT_MAX_PENDING))
    res = _enqueue(r, (PENDING, PAYLOAD, ENQUEUED, WAITING, DONE),
                   (job_id, json.dumps(payload), bound, _done_ttl_ms()))
    if res == -1:
        raise QueueFull(f"queue is full ({bound} jobs pending); retry later "
                        "or raise QUEUE_MAX")
    return job_id


def claim_batch(r: redis.Redis, lease_s: float, n: int
                ) -> list[tuple[str, dict, int]]:
    """Up to n jobs in one script call, each with its own attempt number."""
    rows = _claim(r, (PENDING, INFLIGHT, PAYLOAD, ATTEMPTS, WAITING), (_ms(lease_s), n))
    return [(_text(i), json.loads(p) if p else {}, int(a)) for i, p, a in rows]


def claim(r: redis.Redis, lease_s: float) -> tuple[str, dict, int] | None:
    """The next job with a lease of lease_s seconds: (job_id, payload, attempt)."""
    rows = claim_batch(r, lease_s, 1)
    return rows[0] if rows else None


def ack_batch(r: redis.Redis, items: list[tuple[str, int]]) -> list[bool]:
    """Ack many (job_id, attempt) pairs in one script call; each fenced alone."""
    if not items:
        return []
    args = [_done_ttl_ms()]
    for job_id, attempt in items:
        args += [job_id, int(attempt)]
    res = _ack(r, (INFLIGHT, PAYLOAD, ATTEMPTS, BASE, ERROR, ENQUEUED, DONE), args)
    return [bool(x) for x in res]


def ack(r: redis.Redis, job_id: str, attempt: int) -> bool:
    """Finish the job. False: this attempt no longer holds the lease (a zombie)."""
    return ack_batch(r, [(job_id, attempt)])[0]


def extend(r: redis.Redis, job_id: str, attempt: int, lease_s: float) -> bool:
    """Heartbeat: push the deadline back. False: the lease is gone, stop working."""
    return bool(_extend(r, (INFLIGHT, ATTEMPTS), (job_id, int(attempt), _ms(lease_s))))


def fail(r: redis.Redis, job_id: str, attempt: int, error: str) -> bool:
    """Record the error and expire the lease now; the next reap retries or buries."""
    return bool(_fail(r, (INFLIGHT, ATTEMPTS, ERROR), (job_id, int(attempt), error)))


def reap(r: redis.Redis, max_attempts: int = 3) -> tuple[int, int]:
    """Expired leases back to pending, or to the DLQ: (requeued, dead)."""
    requeued, dead_n = _reap(
        r, (INFLIGHT, PENDING, ATTEMPTS, BASE, ERROR, ENQUEUED, WAITING, DLQ),
        (int(max_attempts), REAP_LIMIT, LEASE_EXPIRED))
    return int(requeued), int(dead_n)


def dead_details(r: redis.Redis) -> list[dict]:
    """The DLQ, oldest death first, with the time of death (server clock, s)."""
    rows = _dead(r, (DLQ, ATTEMPTS, ERROR))
    return [{"job_id": _text(i), "attempts": int(a), "last_error": _text(e),
             "died_at": float(_text(t)) / 1000} for i, a, e, t in rows]


def dead(r: redis.Redis) -> list[tuple[str, int, str]]:
    """The DLQ: (job_id, attempts, last_error), oldest death first."""
    return [(d["job_id"], d["attempts"], d["last_error"]) for d in dead_details(r)]


def redrive(r: redis.Redis) -> int:
    """Move every dead job back to pending with a fresh attempt budget.

    Attempt numbers keep growing (they are fencing tokens); only the budget
    counted against max_attempts starts again.
    """
    return int(_redrive(r, (DLQ, PENDING, ATTEMPTS, BASE, ENQUEUED, WAITING)))


def stats(r: redis.Redis) -> dict:
    """Depths and lag in one call: the numbers to alarm on."""
    pending, inflight, dead_n, age_ms, done = _stats(
        r, (PENDING, INFLIGHT, DLQ, WAITING, DONE))
    return {"pending": int(pending), "inflight": int(inflight), "dead": int(dead_n),
            "oldest_pending_age_s": max(0, int(age_ms)) / 1000,
            "done": int(done)}


def status(r: redis.Redis, job_id: str) -> str | None:
    """'pending', 'inflight', 'dead', 'done' or None (never seen, or forgotten)."""
    p = r.pipeline(transaction=False)
    p.zscore(INFLIGHT, job_id)
    p.zscore(DLQ, job_id)
    p.hexists(PAYLOAD, job_id)
    p.zscore(DONE, job_id)
    inflight, dead_at, known, done_at = p.execute()
    if inflight is not None:
        return "inflight"
    if dead_at is not None:
        return "dead"
    if known:
        return "pending"
    return "done" if done_at is not None else None


def reset(r: redis.Redis) -> None:
    """Delete this queue's keys and nothing else."""
    r.delete(*KEYS)


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
