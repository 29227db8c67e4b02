"""The claims solution: a claim row with a lease; a stale claim is held."""
from handson.confirmation_job import send_email

JOB_TYPE = "send_confirmation"
POINTS_JOB = "award_points"
POLICY = "hold"


def claim(db, job_type, key, now):
    rows = db.query(
        "INSERT INTO handled_operations (job_type, operation_key, status, claimed_at)"
        " VALUES (?, ?, 'claimed', ?)"
        " ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING id",
        (job_type, key, now))
    return rows[0][0] if rows else None


def read(db, job_type, key):
    return db.query("SELECT id, status, claimed_at FROM handled_operations"
                    " WHERE job_type = ? AND operation_key = ?", (job_type, key))[0]


def complete(db, op_id, now):
    db.run("UPDATE handled_operations SET status = 'completed', completed_at = ?"
           " WHERE id = ?", (now, op_id))


def stale(db, mailer, key, op_id, now, pause):
    """A claim older than the lease: hold it for a person."""
    db.run("INSERT INTO held_operations (job_type, operation_key, held_at)"
           " VALUES (?, ?, ?) ON CONFLICT (job_type, operation_key) DO NOTHING",
           (JOB_TYPE, key, now))
    return "held"


def claimed_before(db, mailer, key, now, lease_s, pause):
    """The key was claimed already: done, still in progress, or stale."""
    op_id, status, claimed_at = read(db, JOB_TYPE, key)
    if status == "completed":
        return "skip:completed"
    if now - claimed_at < lease_s:
        return "skip:in-progress"
    return stale(db, mailer, key, op_id, now, pause)


def send_confirmation(db, mailer, key, now, lease_s, pause):
    op_id = claim(db, JOB_TYPE, key, now)
    if op_id is None:
        return claimed_before(db, mailer, key, now, lease_s, pause)
    pause("after-claim")
    send_email(mailer, key)
    pause("after-email")
    complete(db, op_id, now)
    return "sent"


def award_points(db, key, now, lease_s, pause):
    with db.transaction():
        op_id = claim(db, POINTS_JOB, key, now)
        if op_id is not None:
            pause("after-claim")
            db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)",
                   (key, 10))
            pause("after-effect")
            complete(db, op_id, now)
    if op_id is not None:
        return "applied"
    return "skip:" + read(db, POINTS_JOB, key)[1]
