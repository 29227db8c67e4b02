"""Broken on purpose: the dedup keys live for one delivery, not for the job."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def dedup_outside_tx(jobs):
    sink = Sink()
    for job_id, crashes in jobs:
        keys = set()                  # BUG: a new delivery forgets every key
        for attempt in (1, 2) if crashes else (1,):
            key = dedup_key(job_id, attempt)
            if key in keys:
                continue
            sink.apply(job_id)
            if crashes and attempt == 1:
                continue
            keys.add(key)
    return sink
