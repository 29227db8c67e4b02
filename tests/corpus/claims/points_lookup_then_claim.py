"""Broken on purpose: the points job looks its record up, then claims and
applies in a transaction of their own."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def award_points(db, key, now, lease_s, pause):
    # BUG: two deliveries at once both find no record, and both add the row;
    # one after the other, or killed anywhere, it holds
    if db.query("SELECT 1 FROM handled_operations WHERE job_type = ?"
                " AND operation_key = ?", (POINTS_JOB, key)):
        return "skip"
    with db.transaction():
        db.run("INSERT INTO handled_operations (job_type, operation_key, status,"
               " claimed_at) VALUES (?, ?, 'claimed', ?) ON CONFLICT"
               " (job_type, operation_key) DO NOTHING", (POINTS_JOB, key, now))
        pause("after-claim")
        db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)",
               (key, 10))
        pause("after-effect")
        db.run("UPDATE handled_operations SET status = 'completed',"
               " completed_at = ? WHERE job_type = ? AND operation_key = ?",
               (now, POINTS_JOB, key))
    return "applied"
