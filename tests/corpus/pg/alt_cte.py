"""A correct alternative: the claim as a CTE that locks the row, joined by
the UPDATE; finish as the solution's."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    row = conn().execute("""
        WITH next AS (SELECT id FROM pgq_jobs WHERE state = 'pending'
                       ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        UPDATE pgq_jobs j SET state = 'inflight', attempt = j.attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
          FROM next WHERE j.id = next.id
        RETURNING j.id, j.payload, j.attempt""", (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
