"""Where a score lands: the idempotent table or the naive one, in one transaction.

IDEM=1 writes `scores` with INSERT OR IGNORE and bumps the counter only when a
row went in, so a second delivery of the same job changes nothing. IDEM=0 writes
`scores_naive` and always bumps: every delivery is an effect. Either way the
`applied` row is part of the same transaction as the effect it records.
"""

import os
import sqlite3
import time


def apply(db: sqlite3.Connection, job_id: str, doc_id: int, score: float,
          attempt: int, idem: bool) -> bool:
    """Write one score; True if it changed the database (an effect happened)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if idem:
            cur = db.execute("INSERT OR IGNORE INTO scores VALUES (?, ?, ?)",
                             (job_id, doc_id, score))
            effect = cur.rowcount == 1
        else:
            db.execute("INSERT INTO scores_naive VALUES (?, ?, ?)",
                       (job_id, doc_id, score))
            effect = True
        if effect:
            db.execute("UPDATE stats SET n = n + 1")
            db.execute("INSERT INTO applied VALUES (?, ?, ?, ?)",
                       (job_id, attempt, os.getpid(), time.monotonic_ns()))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return effect
