"""Broken on purpose: the key is claimed in the transaction but written after it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def dedup_in_tx(jobs):
    sink, keys = Sink(), set()
    for job_id, crashes in jobs:
        for attempt in (1, 2) if crashes else (1,):
            key = dedup_key(job_id, attempt)
            if key in keys:
                continue
            sink.apply(job_id)        # the "transaction": the effect ...
            if crashes and attempt == 1:
                continue              # BUG: ... commits before the crash
            keys.add(key)             # the key, a second write
    return sink
