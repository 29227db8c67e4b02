"""Broken on purpose: the key is hash() of a string, salted per process."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def dedup_key(job_id, attempt):
    return hash(f"job-{job_id}")      # BUG: PYTHONHASHSEED differs per worker
