"""Broken on purpose: the claim marks its job with a session advisory lock
that it never releases, so the job stays bound to this worker's connection."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    # BUG: pg_try_advisory_lock lasts as long as the connection: once this
    # attempt's lease runs out and the job is reaped, no other worker's claim
    # can take it while this (long-running) worker lives
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = clock_timestamp() + make_interval(secs => %s)
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                       AND pg_try_advisory_lock(hashtext(id))
                      ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id, payload, attempt""", (lease_s,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
