"""Broken on purpose: the lease is the worker's datetime.now(utc) plus
lease_s, not the server's clock_timestamp()."""

import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the solution; below, what changes


def claim(r, lease_s):
    until = (datetime.datetime.now(datetime.timezone.utc)
             + datetime.timedelta(seconds=lease_s))
    row = conn().execute("""
        UPDATE pgq_jobs SET state = 'inflight', attempt = attempt + 1,
               lease_until = %s
         WHERE id = (SELECT id FROM pgq_jobs WHERE state = 'pending'
                      ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING id, payload, attempt""", (until,)).fetchone()
    return None if row is None else (row[0], row[1], int(row[2]))
