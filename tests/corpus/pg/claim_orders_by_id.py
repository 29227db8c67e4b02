"""Broken on purpose: the claim takes the lowest id, not the longest
waiting job (ORDER BY id): a job reaped back to pending, or one whose id
sorts late, waits behind every newer one."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                      ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id, payload, attempt""", (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
