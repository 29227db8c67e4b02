"""A correct queue without Lua: every step is a WATCH/MULTI transaction that retries.

Each function reads what it needs under WATCH, decides in Python, and writes in
MULTI/EXEC; if anything it watched changed in between, EXEC is refused and the
step starts again. Several round trips per call, yet each call takes effect at
one instant (its EXEC), so a rival between two of them changes only how often
it retries. Deadlines are milliseconds of the server's clock (TIME).
"""

import json
import os
import uuid

import redis

P = "{wq}:"
PENDING, LEASES, DLQ, DONE, JOB = (P + "pending", P + "leases", P + "dlq",
                                   P + "done", P + "job:")
EXPIRED = "lease expired (worker died or was too slow)"


class QueueFull(Exception):
    """Enqueue refused: QUEUE_MAX jobs are pending."""


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _now_ms(p) -> int:
    sec, usec = p.time()
    return int(sec) * 1000 + int(usec) // 1000


def _step(r, keys, body):
    """body(pipe) under WATCH keys; again while EXEC is refused."""
    with r.pipeline() as p:
        while True:
            try:
                p.watch(*keys)
                return body(p)
            except redis.WatchError:
                continue


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", 100_000))

    def body(p):
        if p.exists(JOB + job_id) or p.zscore(DONE, job_id) is not None:
            return 0
        if p.llen(PENDING) >= bound:
            return -1
        p.multi()
        p.hset(JOB + job_id, mapping={"payload": json.dumps(payload),
                                      "attempts": 0})
        p.lpush(PENDING, job_id)
        p.execute()
        return 1

    if _step(r, (JOB + job_id, DONE, PENDING), body) == -1:
        raise QueueFull(f"{bound} jobs pending")
    return job_id


def claim(r, lease_s):
    def body(p):
        job_id = p.lindex(PENDING, -1)
        if job_id is None:
            return None
        job_id = _s(job_id)
        deadline = _now_ms(p) + max(1, round(lease_s * 1000))
        p.multi()
        p.rpop(PENDING)
        p.hincrby(JOB + job_id, "attempts", 1)
        p.hdel(JOB + job_id, "failed")
        p.zadd(LEASES, {job_id: deadline})
        p.hget(JOB + job_id, "payload")
        _, n, _, _, payload = p.execute()
        return job_id, json.loads(payload or "{}"), int(n)

    return _step(r, (PENDING,), body)


def _holder(p, job_id, attempt):
    """Is the lease still this attempt's (not reaped, not failed)?"""
    lease = p.zscore(LEASES, job_id)
    current, failed = p.hmget(JOB + job_id, "attempts", "failed")
    return (lease is not None and failed is None and current is not None
            and int(current) == int(attempt))


def ack(r, job_id, attempt):
    def body(p):
        if not _holder(p, job_id, attempt):
            return False
        now = _now_ms(p)
        p.multi()
        p.zrem(LEASES, job_id)
        p.delete(JOB + job_id)
        p.zadd(DONE, {job_id: now})
        p.execute()
        return True

    return _step(r, (LEASES, JOB + job_id), body)


def extend(r, job_id, attempt, lease_s):
    def body(p):
        if not _holder(p, job_id, attempt):
            return False
        deadline = _now_ms(p) + max(1, round(lease_s * 1000))
        p.multi()
        p.zadd(LEASES, {job_id: deadline}, xx=True)
        p.execute()
        return True

    return _step(r, (LEASES, JOB + job_id), body)


def fail(r, job_id, attempt, error):
    def body(p):
        if not _holder(p, job_id, attempt):
            return False
        p.multi()
        p.hset(JOB + job_id, mapping={"error": error, "failed": 1})
        p.zadd(LEASES, {job_id: 0}, xx=True)
        p.execute()
        return True

    return _step(r, (LEASES, JOB + job_id), body)


def reap(r, max_attempts=3):
    def body(p):
        now = _now_ms(p)
        expired = [_s(i) for i in p.zrangebyscore(LEASES, "-inf", now)]
        facts = [p.hmget(JOB + i, "attempts", "failed") for i in expired]
        p.multi()
        requeued = dead_n = 0
        for job_id, (attempts, failed) in zip(expired, facts, strict=True):
            p.zrem(LEASES, job_id)
            if failed is None:
                p.hset(JOB + job_id, "error", EXPIRED)
            if int(attempts or 0) >= max_attempts:
                p.zadd(DLQ, {job_id: now})
                dead_n += 1
            else:
                p.lpush(PENDING, job_id)
                requeued += 1
        p.execute()
        return requeued, dead_n

    return _step(r, (LEASES,), body)


def dead(r):
    out = []
    for job_id in r.zrange(DLQ, 0, -1):
        attempts, error = r.hmget(JOB + _s(job_id), "attempts", "error")
        out.append((_s(job_id), int(attempts or 0), _s(error or b"")))
    return out
