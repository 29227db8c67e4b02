"""A correct alternative: the claim picks and claims in two statements of ONE
transaction; the row lock holds until the COMMIT, so a rival skips it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    c = conn()
    with c.transaction():
        picked = c.execute(
            "SELECT id FROM pgq_jobs WHERE state = 'pending' "
            "ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
        if picked is None:
            return None
        row = c.execute(
            "UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1, "
            "lease_until = clock_timestamp() + make_interval(secs => %s) "
            "WHERE id = %s RETURNING id, payload, attempt",
            (lease_s, picked[0])).fetchone()
    return row[0], row[1], int(row[2])
