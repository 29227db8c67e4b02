"""The delivery-semantics solution: the notebook's functions, as it defines them."""

import random

from handson.c01_job_scheduler import Sink, stream


def ack_before_work(jobs):
    sink = Sink()
    for job_id, crashes in jobs:
        if crashes:
            continue              # the ack already happened: nothing redelivers
        sink.apply(job_id)
    return sink


def ack_after_work(jobs):
    sink = Sink()
    for job_id, crashes in jobs:
        sink.apply(job_id)
        if crashes:
            sink.apply(job_id)    # no ack reached the queue: redelivered, redone
    return sink


def dedup_key(job_id, attempt):
    return job_id                 # stable across attempts; the attempt is not


def dedup_outside_tx(jobs):
    sink, keys = Sink(), set()
    for job_id, crashes in jobs:
        for attempt in (1, 2) if crashes else (1,):
            key = dedup_key(job_id, attempt)
            if key in keys:
                continue
            sink.apply(job_id)                 # write 1: the effect
            if crashes and attempt == 1:
                continue                       # the crash: write 2 never happens
            keys.add(key)                      # write 2: the key
    return sink


def dedup_in_tx(jobs):
    sink, keys = Sink(), set()
    for job_id, crashes in jobs:
        for attempt in (1, 2) if crashes else (1,):
            key = dedup_key(job_id, attempt)
            if key in keys:
                continue
            if crashes and attempt == 1:
                continue                       # crashed before the commit
            keys.add(key)                      # one commit: key and effect
            sink.apply(job_id)
    return sink


def window_escapes(window, max_delay=2000, seed=17):
    rng = random.Random(seed)
    seen, order, applied, waiting = set(), [], {}, []

    def deliver(job_id):
        if job_id in seen:
            return
        seen.add(job_id)
        order.append(job_id)
        if len(order) > window:
            seen.discard(order.pop(0))         # the oldest key is forgotten
        applied[job_id] = applied.get(job_id, 0) + 1

    for job_id, crashes in stream():
        deliver(job_id)
        if crashes:
            waiting.append([job_id, rng.randint(1, max_delay)])
        for entry in waiting:
            entry[1] -= 1
        for late, _ in [e for e in waiting if e[1] <= 0]:
            deliver(late)
        waiting = [e for e in waiting if e[1] > 0]
    for late, _ in waiting:
        deliver(late)
    return sum(1 for n in applied.values() if n > 1)


def lease_doubles(lease_s, n=20_000, seed=31):
    rng, doubles = random.Random(seed), 0
    for _ in range(n):
        work = (rng.expovariate(1 / 2.0) if rng.random() > 0.05
                else rng.expovariate(1 / 40.0))
        if work > lease_s:
            doubles += 1
    return doubles
