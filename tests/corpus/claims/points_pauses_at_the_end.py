"""Broken on purpose: the points claim, ledger row and status commit one by
one, and both named points come after all three, where a kill loses nothing."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def award_points(db, key, now, lease_s, pause):
    # BUG: no transaction: a worker killed after the ledger row leaves a
    # claimed record, and the redelivery after the lease adds the row again
    op_id = claim(db, POINTS_JOB, key, now)
    if op_id is None:
        op_id, status, claimed_at = read(db, POINTS_JOB, key)
        if status == "completed" or now - claimed_at < lease_s:
            return "skip"
    db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)", (key, 10))
    complete(db, op_id, now)
    pause("after-claim")
    pause("after-effect")
    return "applied"
