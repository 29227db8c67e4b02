"""Broken on purpose: the claim locks its row with a plain FOR UPDATE, so it
queues up behind a rival that holds the oldest row."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    # BUG: no SKIP LOCKED: waits for the holder, then finds its row taken
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                      ORDER BY queued_at, id LIMIT 1 FOR UPDATE)
        RETURNING id, payload, attempt""", (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
