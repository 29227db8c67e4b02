"""Each system under test: how to fill it, how to count what is left, how to work.

A system is three functions. `fill(r, n)` adds n no-op jobs to what is waiting
(the runner tops a queue up while its workers are paused); `remaining(r)` counts
jobs still waiting, read straight from the
broker's list so the probe costs the same for everyone; `work()` runs in a
worker process (one job at a time, as a single-threaded worker) until killed.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable

import redis

from handson import q
from handson.bench import tasks

LEASE_S = 60.0
BATCH = 100
BATCHED_QUEUE = "qb"
FUSED_QUEUE = "qf"
FILL_CHUNK = 10_000             # jobs per fill call (the server is busy meanwhile)


@dataclass(frozen=True)
class System:
    name: str
    fill: Callable[[redis.Redis, int], None]
    remaining: Callable[[redis.Redis], int]
    work: Callable[[], None]
    needs: str | None = None          # the peer package it needs, if any
    batched: bool = False

    def missing(self) -> str | None:
        """Why this system cannot run here, or None."""
        if self.needs and importlib.util.find_spec(self.needs) is None:
            return (f"{self.needs} is not installed (make bench installs it from "
                    "requirements.txt)")
        return None


def _client() -> redis.Redis:
    return redis.Redis.from_url(tasks.url())


# -- the reference queue ---------------------------------------------------------
# One worker per job, the batched worker and the fused worker get queues of
# their own, so all can be loaded at once on one server.

UNBOUNDED = 10**9


# The queue's own enqueue script, run once per job in a loop on the server: the
# same state as n calls of q.enqueue, without n round trips of packing in Python.
_FILL = f"""
local function enqueue(KEYS, ARGV)
{q._ENQUEUE}
end
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  enqueue(KEYS, {{'j' .. i, '{{}}', ARGV[3], ARGV[4]}})
end
"""


def _ref_filler(queue: str) -> Callable[[redis.Redis, int], None]:
    def fill(r: redis.Redis, n: int) -> None:
        first = r.incrby(f"bench:{queue}:filled", n) - n    # job ids stay unique
        k = q.keys(queue)
        script = r.register_script(_FILL)
        for start in range(first, first + n, FILL_CHUNK):
            script(keys=[k.pending, k.jobs, k.done],
                   args=[start, min(first + n, start + FILL_CHUNK) - 1, UNBOUNDED,
                         q._done_ttl_ms()])
    return fill


def _ref_counter(queue: str) -> Callable[[redis.Redis], int]:
    return lambda r: r.llen(q.keys(queue).pending)


def _ref_work() -> None:
    r = _client()
    while True:
        job = q.claim(r, LEASE_S)
        if job is None:
            time.sleep(0.001)
            continue
        job_id, _payload, attempt = job
        tasks.noop()
        q.ack(r, job_id, attempt)


def _ref_work_fused() -> None:
    """Busy, each ack claims the next job: one round trip per job."""
    r = _client()
    job = None
    while True:
        if job is None:
            job = q.claim(r, LEASE_S, queue=FUSED_QUEUE)
            if job is None:
                time.sleep(0.001)
                continue
        tasks.noop()
        _acked, job = q.ack_and_claim(r, job[0], job[2], LEASE_S, queue=FUSED_QUEUE)


def _ref_work_batched() -> None:
    r = _client()
    while True:
        jobs = q.claim_batch(r, LEASE_S, BATCH, queue=BATCHED_QUEUE)
        if not jobs:
            time.sleep(0.001)
            continue
        for _job in jobs:
            tasks.noop()
        q.ack_batch(r, [(job_id, attempt) for job_id, _p, attempt in jobs],
                    queue=BATCHED_QUEUE)


# -- RQ ------------------------------------------------------------------------

def _rq_fill(r: redis.Redis, n: int) -> None:
    from rq import Queue

    queue = Queue("bench", connection=r)
    for start in range(0, n, FILL_CHUNK):
        queue.enqueue_many([Queue.prepare_data(tasks.noop)
                            for _ in range(start, min(n, start + FILL_CHUNK))])


def _rq_remaining(r: redis.Redis) -> int:
    return r.llen("rq:queue:bench")


def _rq_work() -> None:
    from rq import Queue, SimpleWorker

    r = _client()
    SimpleWorker([Queue("bench", connection=r)], connection=r).work(
        burst=False, logging_level="WARNING")


# -- Celery (acks_late) --------------------------------------------------------

def _celery_fill(r: redis.Redis, n: int) -> None:
    app = tasks.celery_app()
    task = app.tasks["bench.noop"]
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            task.apply_async(queue="bench", producer=producer)


def _celery_remaining(r: redis.Redis) -> int:
    return r.llen("bench")


def _celery_work() -> None:
    app = tasks.celery_app()
    app.worker_main(["worker", "--pool=solo", "--concurrency=1", "-Q", "bench",
                     "--loglevel=WARNING", "--without-heartbeat", "--without-gossip",
                     "--without-mingle"])


# -- huey ----------------------------------------------------------------------

def _huey_fill(r: redis.Redis, n: int) -> None:
    huey, task = tasks.huey_app()
    for _ in range(n):
        task()


def _huey_remaining(r: redis.Redis) -> int:
    return r.llen("huey.redis.bench")


def _huey_work() -> None:
    huey, _task = tasks.huey_app()
    huey.create_consumer(workers=1, periodic=False, initial_delay=0.001,
                         max_delay=0.01, check_worker_health=False).run()


# -- dramatiq ------------------------------------------------------------------

def _dramatiq_fill(r: redis.Redis, n: int) -> None:
    _broker, actor = tasks.dramatiq_actor()
    for _ in range(n):
        actor.send()


def _dramatiq_remaining(r: redis.Redis) -> int:
    return r.llen("dramatiq:bench")


def _dramatiq_work() -> None:
    from dramatiq import Worker

    broker, _actor = tasks.dramatiq_actor()
    worker = Worker(broker, worker_threads=1)
    worker.start()
    signal.signal(signal.SIGTERM, lambda *_: (worker.stop(), os._exit(0)))
    while True:
        time.sleep(1)


SYSTEMS = {s.name: s for s in [
    System("reference", _ref_filler("q"), _ref_counter("q"), _ref_work),
    System("reference-fused", _ref_filler(FUSED_QUEUE), _ref_counter(FUSED_QUEUE),
           _ref_work_fused),
    System("reference-batched", _ref_filler(BATCHED_QUEUE),
           _ref_counter(BATCHED_QUEUE), _ref_work_batched, batched=True),
    System("rq", _rq_fill, _rq_remaining, _rq_work, needs="rq"),
    System("celery", _celery_fill, _celery_remaining, _celery_work, needs="celery"),
    System("huey", _huey_fill, _huey_remaining, _huey_work, needs="huey"),
    System("dramatiq", _dramatiq_fill, _dramatiq_remaining, _dramatiq_work,
           needs="dramatiq"),
]}
