"""Broken on purpose: the heartbeat thread is started once the work is done,
so no beat renews the lease while the work runs."""

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
    try:
        work(stop)
    finally:
        finished.set()
        thread.start()      # BUG: started (and ended at once) after the work
        thread.join()
    return not lost and bool(queue.extend(r, job_id, attempt, lease_s))
