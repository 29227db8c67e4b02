"""Broken on purpose: the relay publishes the rows it read, then marks every row
between the first and the last id it read."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
    if rows:
        # BUG: "the ids I read are a range": a row whose id was taken before
        # and that committed while the batch was out lies inside it unread
        db.run("UPDATE outbox SET sent = 1 WHERE id BETWEEN ? AND ?",
               (rows[0][0], rows[-1][0]))
    return len(rows)
