"""A correct alternative: the work runs in a thread and the caller's thread
beats while it waits for it, with extend as a script that reads the attempt
first."""

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the heartbeats solution; below, what it changes
from correct import INFLIGHT, JOBS


def extend(r, job_id, attempt, lease_s):
    script = """
    if redis.call('HGET', KEYS[2], 'a:' .. ARGV[1]) ~= ARGV[2] then return 0 end
    local lease = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
    if lease <= 0 then return 0 end           -- reaped, or failed: not ours
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    return redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ARGV[3], ARGV[1]) + 1
    """
    ms = max(1, round(lease_s * 1000))
    return bool(r.eval(script, 2, INFLIGHT, JOBS, job_id, str(int(attempt)), ms))


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    stop = threading.Event()
    worker = threading.Thread(target=work, args=(stop,), daemon=True)
    worker.start()
    while True:
        worker.join(lease_s / 3)
        if not worker.is_alive():
            break
        if not queue.extend(r, job_id, attempt, lease_s):
            stop.set()
            worker.join()
            return False
    return bool(queue.extend(r, job_id, attempt, lease_s))
