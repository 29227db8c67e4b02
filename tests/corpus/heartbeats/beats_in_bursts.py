"""Broken on purpose: "two beats in case one is lost": each round sends two
extends back to back, then waits 0.8 * lease_s; two beats at once are one."""
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, the one change


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop, finished, lost = threading.Event(), threading.Event(), []

    def beat():
        while not finished.wait(lease_s * 0.8):
            for _ in range(2):
                if not queue.extend(r, job_id, attempt, lease_s):
                    lost.append(True)
                    stop.set()
                    return

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        work(stop)
    finally:
        finished.set()
        t.join()
    return not lost and bool(queue.extend(r, job_id, attempt, lease_s))
