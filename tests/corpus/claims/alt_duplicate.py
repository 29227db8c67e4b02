"""Another correct policy, written down: a stale claim is sent again."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import correct  # the claims solution; below, what this one changes
from correct import *

POLICY = "duplicate"


def stale(db, mailer, key, op_id, now, pause):
    """A claim older than the lease: take it over in one statement (so one
    worker resends) and send again: a duplicate, accepted in advance."""
    if not db.query("UPDATE handled_operations SET claimed_at = ? WHERE id = ?"
                    " AND status = 'claimed' AND claimed_at < ? RETURNING id",
                    (now, op_id, now)):
        return "skip:taken-over"
    send_email(mailer, key)
    complete(db, op_id, now)
    return "resent"


correct.stale = stale   # the solution's claimed_before calls it by that name
