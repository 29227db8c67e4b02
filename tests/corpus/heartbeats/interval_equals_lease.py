"""Broken on purpose: the heartbeat renews once a lease, so one beat late (a
busy machine, a slow round trip) and the lease is gone."""

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished, lost = threading.Event(), threading.Event(), []

    def beat():
        # BUG: "renew before it runs out": a beat every lease_s leaves no slack
        while not finished.wait(lease_s):
            if not queue.extend(r, job_id, attempt, lease_s):
                lost.append(True)
                stop.set()
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    return not lost and bool(queue.extend(r, job_id, attempt, lease_s))
