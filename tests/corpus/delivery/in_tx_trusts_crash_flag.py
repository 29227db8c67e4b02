"""Broken on purpose: the in-transaction dedup reads the crash flag, keeps no key."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def dedup_in_tx(jobs):
    sink = Sink()
    for job_id, _crashes in jobs:
        # attempt 1 crashed before its commit, so the job is applied once
        sink.apply(job_id)            # BUG: a later delivery applies it again
    return sink
