"""Broken on purpose: the window's keys and counts are kept at module level."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

SEEN, ORDER, APPLIED = set(), [], {}


def window_escapes(window, max_delay=2000, seed=17):
    rng, waiting = random.Random(seed), []

    def deliver(job_id):
        if job_id in SEEN:            # BUG: the last call's keys are still here
            return
        SEEN.add(job_id)
        ORDER.append(job_id)
        if len(ORDER) > window:
            SEEN.discard(ORDER.pop(0))
        APPLIED[job_id] = APPLIED.get(job_id, 0) + 1

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
    return sum(1 for n in APPLIED.values() if n > 1)
