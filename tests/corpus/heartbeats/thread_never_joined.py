"""Broken on purpose: the heartbeat thread is never told the work finished nor
joined: it beats on after the function returned, on a job the caller has
acked or abandoned, until an extend says no."""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop = threading.Event()

    def beat():
        while True:             # BUG: no way to end it but a refused extend
            time.sleep(lease_s / 3)
            if not queue.extend(r, job_id, attempt, lease_s):
                stop.set()
                return

    threading.Thread(target=beat, daemon=True).start()
    work(stop)
    return not stop.is_set() and bool(queue.extend(r, job_id, attempt, lease_s))
