"""A window kept as a deque, the late deliveries as a heap of due positions."""

import collections
import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, another way to write it


def window_escapes(window, max_delay=2000, seed=17):
    rng = random.Random(seed)
    seen, order = set(), collections.deque()
    applied = collections.Counter()
    due = []                                   # (position it lands after, seq, id)

    def deliver(job_id):
        if job_id in seen:
            return
        seen.add(job_id)
        order.append(job_id)
        if len(order) > window:
            seen.discard(order.popleft())
        applied[job_id] += 1

    for i, (job_id, crashes) in enumerate(stream()):
        deliver(job_id)
        if crashes:
            heapq.heappush(due, (i + rng.randint(1, max_delay) - 1, i, job_id))
        while due and due[0][0] <= i:
            deliver(heapq.heappop(due)[2])
    for _, _, job_id in sorted(due, key=lambda e: e[1]):
        deliver(job_id)
    return sum(1 for n in applied.values() if n > 1)
