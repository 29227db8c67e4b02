"""Broken on purpose: "ack before work" written as the ack after the work."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def ack_before_work(jobs):
    sink = Sink()
    for job_id, crashes in jobs:
        sink.apply(job_id)            # BUG: the work ran before the ack
        if crashes:
            sink.apply(job_id)
    return sink
