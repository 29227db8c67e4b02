"""Designs that return a plain dict of counts; a lease count as one sum."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, another way to write it


def ack_before_work(jobs):
    applied = {}
    for job_id, crashes in jobs:
        if not crashes:
            applied[job_id] = applied.get(job_id, 0) + 1
    return applied


def ack_after_work(jobs):
    applied = {}
    for job_id, crashes in jobs:
        applied[job_id] = applied.get(job_id, 0) + (2 if crashes else 1)
    return applied


def lease_doubles(lease_s, n=20_000, seed=31):
    rng = random.Random(seed)

    def duration():
        fast = rng.random() > 0.05
        return rng.expovariate(1 / 2.0 if fast else 1 / 40.0)

    return sum(duration() > lease_s for _ in range(n))
