"""Broken on purpose: extend checks the attempt, then moves the deadline later."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def extend(r, job_id, attempt, lease_s):
    # BUG: ZADD XX keeps a reaped lease gone, but if reap and a new claim ran
    # in between, the zombie says True and stretches the new owner's lease
    current = r.hget(JOB + job_id, "attempts")
    if r.zscore(INFLIGHT, job_id) is None or int(current or 0) != int(attempt):
        return False
    sec, usec = r.time()
    r.zadd(INFLIGHT, {job_id: sec + usec / 1e6 + lease_s}, xx=True)
    return True
