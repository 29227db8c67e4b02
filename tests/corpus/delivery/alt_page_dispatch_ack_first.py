"""Ack before work through the page's own Broker (`dispatch`): a job's worker
crashes on it once, and the broker, acked first, keeps nothing to redeliver."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, another way to write it

from handson.c01_job_scheduler import dispatch


def ack_before_work(jobs):
    return dispatch(jobs, ack_first=True)[0]
