"""Broken on purpose: the dedup key includes the attempt number."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def dedup_key(job_id, attempt):
    return (job_id, attempt)          # BUG: attempt 2 never finds attempt 1's key
