"""Another correct outbox: the relay deletes a row once published; the consumer
looks its key up inside the transaction."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, what this one changes


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox ORDER BY id LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("DELETE FROM outbox WHERE id = ?", (outbox_id,))
    return len(rows)


def summarize(db, doc_id):
    with db.transaction():
        if db.query("SELECT 1 FROM summarized WHERE doc_id = ?", (doc_id,)):
            return False
        db.run("INSERT INTO summarized (doc_id) VALUES (?)", (doc_id,))
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
