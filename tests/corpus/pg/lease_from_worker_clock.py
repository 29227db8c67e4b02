"""Broken on purpose: the lease is the worker's time.time() plus lease_s, not
the server's clock_timestamp()."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    # BUG: a worker whose clock runs ahead hands out leases that never expire
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = to_timestamp(%s)
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                      ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id, payload, attempt""", (time.time() + lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
