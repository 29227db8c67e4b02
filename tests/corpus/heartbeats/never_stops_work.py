"""Broken on purpose: when extend says no, the heartbeat stops beating but
does not tell the work, which runs to its end; the caller is told to commit."""

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished = threading.Event(), threading.Event()

    def beat():
        while not finished.wait(lease_s / 3):
            if not queue.extend(r, job_id, attempt, lease_s):
                return          # BUG: neither `stop` set nor the loss kept

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    return True
