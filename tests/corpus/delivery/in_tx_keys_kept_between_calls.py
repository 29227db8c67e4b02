"""Broken on purpose: the dedup set is made once, at module level."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

_KEYS = set()


def dedup_in_tx(jobs):
    sink = Sink()
    for job_id, crashes in jobs:
        for attempt in (1, 2) if crashes else (1,):
            key = dedup_key(job_id, attempt)
            if key in _KEYS:          # BUG: the last call's keys are still here
                continue
            if crashes and attempt == 1:
                continue
            _KEYS.add(key)
            sink.apply(job_id)
    return sink
