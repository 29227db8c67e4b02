"""Broken on purpose: the points job opens its transaction by hand and never
rolls it back when the work raises."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def award_points(db, key, now, lease_s, pause):
    db.run("BEGIN IMMEDIATE")
    # BUG: no ROLLBACK when the work raises: a killed worker's connection
    # dies with its transaction, but a live worker's stays open into the
    # next delivery
    op_id = claim(db, POINTS_JOB, key, now)
    if op_id is not None:
        pause("after-claim")
        db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)",
               (key, 10))
        pause("after-effect")
        complete(db, op_id, now)
    db.run("COMMIT")
    if op_id is not None:
        return "applied"
    return "skip:" + read(db, POINTS_JOB, key)[1]
