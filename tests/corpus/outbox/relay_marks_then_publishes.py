"""Broken on purpose: the relay marks a row sent, then publishes it; its pause
comes after both, where a kill loses nothing."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        # BUG: a relay killed after the mark and before the publish never
        # publishes the row; the named point sits where no kill shows it
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
    return len(rows)
