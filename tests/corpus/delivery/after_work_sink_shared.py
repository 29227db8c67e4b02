"""Broken on purpose: one Sink for every call, made at module level."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

_SINK = Sink()


def ack_after_work(jobs):
    for job_id, crashes in jobs:
        _SINK.apply(job_id)           # BUG: the last call's effects count again
        if crashes:
            _SINK.apply(job_id)
    return _SINK
