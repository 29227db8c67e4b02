"""Another correct points job: claim, ledger row and status in one
transaction, with the after-effect point once it has committed; a failure
there leaves the points applied once, and the redelivery skips them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, what this one changes


def award_points(db, key, now, lease_s, pause):
    with db.transaction():
        op_id = claim(db, POINTS_JOB, key, now)
        if op_id is not None:
            pause("after-claim")
            db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)",
                   (key, 10))
            complete(db, op_id, now)
    if op_id is not None:
        pause("after-effect")
        return "applied"
    return "skip:" + read(db, POINTS_JOB, key)[1]
