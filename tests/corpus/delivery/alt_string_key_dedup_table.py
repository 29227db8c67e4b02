"""A key that names its job as text, and both dedups reading one table of keys."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, another way to write it


def dedup_key(job_id, attempt):
    return f"job:{job_id}"


def _deliver_all(jobs, commit_first):
    """Each delivery, its redelivery after a crash; the key table decides."""
    sink, table = Sink(), {}
    for job_id, crashes in jobs:
        attempts = [1, 2] if crashes else [1]
        for attempt in attempts:
            if dedup_key(job_id, attempt) in table:
                break
            crashed = crashes and attempt == 1
            if commit_first and crashed:
                continue
            sink.apply(job_id)
            if not crashed:
                table[dedup_key(job_id, attempt)] = attempt
    return sink


def dedup_outside_tx(jobs):
    return _deliver_all(jobs, commit_first=False)


def dedup_in_tx(jobs):
    return _deliver_all(jobs, commit_first=True)
