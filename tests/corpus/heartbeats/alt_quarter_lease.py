"""A correct alternative: beats every lease_s / 4 (three can be lost), and the
loss kept in an Event rather than a list."""

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished = threading.Event(), threading.Event()

    def beat():
        while not finished.wait(lease_s / 4):
            if not queue.extend(r, job_id, attempt, lease_s):
                stop.set()
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    return not stop.is_set() and bool(queue.extend(r, job_id, attempt, lease_s))
