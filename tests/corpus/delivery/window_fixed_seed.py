"""Broken on purpose: the window draws its delays from the page seed, not `seed`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def window_escapes(window, max_delay=2000, seed=17):
    rng = random.Random(17)           # BUG: seed is not used
    seen, order, applied, waiting = set(), [], {}, []

    def deliver(job_id):
        if job_id in seen:
            return
        seen.add(job_id)
        order.append(job_id)
        if len(order) > window:
            seen.discard(order.pop(0))
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
