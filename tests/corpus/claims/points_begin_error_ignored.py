"""Broken on purpose: the points job opens its transaction by hand, never
rolls it back, and ignores the error its next BEGIN raises, so a failed
attempt's transaction stays open and its record stays claimed."""

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def award_points(db, key, now, lease_s, pause):
    try:
        db.run("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:
        # BUG: "cannot start a transaction within a transaction" means the
        # failed attempt's transaction is still open; going on inside it
        # hides that, and its claim is never completed
        pass
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
