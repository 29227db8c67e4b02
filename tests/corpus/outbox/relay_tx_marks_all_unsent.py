"""Broken on purpose: the relay reads one batch and marks every unsent row
sent, all in one write transaction."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def relay_once(db, r, queue, pause, batch=100):
    with db.transaction():      # no writer commits while this runs
        rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0"
                        " ORDER BY id LIMIT ?", (batch,))
        for outbox_id, doc_id in rows:
            queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
            pause("between", outbox_id)
        # BUG: "no writer got in, so every unsent row is one I read": the
        # rows beyond the batch are marked sent, never published
        db.run("UPDATE outbox SET sent = 1 WHERE sent = 0")
    return len(rows)
