"""Broken on purpose: send_confirmation never announces the point after its claim."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def send_confirmation(db, mailer, key, now, lease_s, pause):
    op_id = claim(db, JOB_TYPE, key, now)
    if op_id is None:
        return claimed_before(db, mailer, key, now, lease_s, pause)
    send_email(mailer, key)        # BUG: no pause("after-claim") before it
    pause("after-email")
    complete(db, op_id, now)
    return "sent"
