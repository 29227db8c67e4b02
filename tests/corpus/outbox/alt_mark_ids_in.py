"""Another correct outbox: the relay publishes the rows it read, then marks
exactly those ids sent in one statement."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, what this one changes


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
    if rows:
        marks = ", ".join("?" for _ in rows)
        db.run(f"UPDATE outbox SET sent = 1 WHERE id IN ({marks})",
               tuple(i for i, _ in rows))
    return len(rows)
