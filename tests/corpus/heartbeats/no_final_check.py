"""Broken on purpose: the work finishing is taken as the lease still held; a
worker frozen after its last beat commits a job that is someone else's."""

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished, lost = threading.Event(), threading.Event(), []

    def beat():
        while not finished.wait(lease_s / 3):
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
    return not lost     # BUG: no last extend after the work returned
