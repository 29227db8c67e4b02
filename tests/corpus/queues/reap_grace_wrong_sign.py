"""Broken on purpose: reap's drift grace has the wrong sign (100 ms early)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import reap_own_clock  # noqa: E402  (its script, with a cutoff we choose)
from mini_correct import *  # the correct queue; below, the one bug


def reap(r, max_attempts=3):
    # BUG: meant to wait 100 ms past the deadline for drift, adds it the
    # other way: a lease is taken 100 ms before it ends
    sec, usec = r.time()
    res = lua(r, reap_own_clock.REAP, (INFLIGHT, PENDING, DLQ, JOB),
              (max_attempts, EXPIRED, sec + usec / 1e6 + 0.1))
    return int(res[0]), int(res[1])
