"""Broken on purpose: each job gets the next number of this worker's own counter."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

_IDS = {}


def dedup_key(job_id, attempt):
    return _IDS.setdefault(job_id, len(_IDS))   # BUG: numbering is per process
