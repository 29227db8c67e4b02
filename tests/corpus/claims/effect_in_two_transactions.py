"""Broken on purpose: the points claim commits before the ledger row."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def award_points(db, key, now, lease_s, pause):
    # BUG: the claim commits alone; a worker killed before the ledger row
    # leaves a claim whose effect never happens (or, taken over, happens twice)
    op_id = claim(db, POINTS_JOB, key, now)
    if op_id is None:
        op_id, status, claimed_at = read(db, POINTS_JOB, key)
        if status == "completed" or now - claimed_at < lease_s:
            return "skip"
    pause("after-claim")
    db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)", (key, 10))
    pause("after-effect")
    complete(db, op_id, now)
    return "applied"
