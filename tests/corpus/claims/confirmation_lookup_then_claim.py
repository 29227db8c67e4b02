"""Broken on purpose: send_confirmation looks its record up first, then
inserts the claim without reading whether the insert took the row."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def send_confirmation(db, mailer, key, now, lease_s, pause):
    if db.query("SELECT 1 FROM handled_operations WHERE job_type = ?"
                " AND operation_key = ?", (JOB_TYPE, key)):
        return claimed_before(db, mailer, key, now, lease_s, pause)
    # BUG: nobody had it a moment ago; a rival may claim it right now, and
    # this insert, ignored, does not stop the email
    db.run("INSERT INTO handled_operations (job_type, operation_key, status,"
           " claimed_at) VALUES (?, ?, 'claimed', ?)"
           " ON CONFLICT (job_type, operation_key) DO NOTHING",
           (JOB_TYPE, key, now))
    op_id = read(db, JOB_TYPE, key)[0]
    pause("after-claim")
    send_email(mailer, key)
    pause("after-email")
    complete(db, op_id, now)
    return "sent"
