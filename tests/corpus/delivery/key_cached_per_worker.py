"""Broken on purpose: a key drawn once per job and kept in the worker's memory."""

import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

_KEYS = {}


def dedup_key(job_id, attempt):
    # BUG: stable in this process only; the redelivery's worker draws another
    return _KEYS.setdefault(job_id, f"{job_id}-{uuid.uuid4().hex[:8]}")
