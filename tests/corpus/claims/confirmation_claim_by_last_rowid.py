"""Broken on purpose: send_confirmation learns whether it claimed from
last_insert_rowid(), which the connection remembers from its last insert."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the claims solution; below, the one bug


def claim_by_rowid(db, job_type, key, now):
    db.run("INSERT INTO handled_operations (job_type, operation_key, status,"
           " claimed_at) VALUES (?, ?, 'claimed', ?)"
           " ON CONFLICT (job_type, operation_key) DO NOTHING",
           (job_type, key, now))
    # BUG: an ignored insert leaves last_insert_rowid() at the connection's
    # previous insert; only a fresh connection gives 0 there
    return db.query("SELECT last_insert_rowid()")[0][0] or None


def send_confirmation(db, mailer, key, now, lease_s, pause):
    op_id = claim_by_rowid(db, JOB_TYPE, key, now)
    if op_id is None:
        return claimed_before(db, mailer, key, now, lease_s, pause)
    pause("after-claim")
    send_email(mailer, key)
    pause("after-email")
    complete(db, op_id, now)
    return "sent"
