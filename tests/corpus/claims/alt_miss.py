"""Another correct policy, written down: a stale claim is given up (a miss)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import correct  # the claims solution; below, what this one changes
from correct import *

POLICY = "miss"


def stale(db, mailer, key, op_id, now, pause):
    """A claim older than the lease: give the email up (a miss, never two)."""
    complete(db, op_id, now)
    return "missed"


correct.stale = stale   # the solution's claimed_before calls it by that name
