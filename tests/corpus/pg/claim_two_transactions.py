"""Broken on purpose: the claim picks the row in one statement (its own
transaction) and claims it in the next, by id alone."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    # BUG: the row lock ends with the SELECT's autocommit; a rival claim that
    # runs before the UPDATE picks the same row
    picked = conn().execute(
        "SELECT id FROM pgq_jobs WHERE state = 'pending' "
        "ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
    if picked is None:
        return None
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
         WHERE id = %s RETURNING id, payload, attempt""",
                         (lease_s, picked[0])).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
