"""Broken on purpose: a claim younger than the lease is taken for abandoned."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import correct  # the claims solution; below, the one bug
from correct import *


def claimed_before(db, mailer, key, now, lease_s, pause):
    op_id, status, claimed_at = read(db, JOB_TYPE, key)
    if status == "completed":
        return "skip:completed"
    if now - claimed_at < lease_s:
        # BUG: "the other worker must be gone": it may be sending right now
        send_email(mailer, key)
        complete(db, op_id, now)
        return "resent"
    return stale(db, mailer, key, op_id, now, pause)


correct.claimed_before = claimed_before   # the solution's send_confirmation calls it
