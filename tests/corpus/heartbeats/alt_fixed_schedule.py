"""A correct alternative: beats on a fixed schedule (start + k * lease_s / 3),
so a slow extend does not push every later beat back."""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished, lost = threading.Event(), threading.Event(), []
    every = lease_s / 3

    def beat():
        due = time.monotonic() + every
        while not finished.wait(max(0.0, due - time.monotonic())):
            if not queue.extend(r, job_id, attempt, lease_s):
                lost.append(True)
                stop.set()
                return
            due = max(due + every, time.monotonic())

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    return not lost and bool(queue.extend(r, job_id, attempt, lease_s))
