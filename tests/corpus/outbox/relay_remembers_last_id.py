"""Broken on purpose: the relay remembers in memory the last id it published
and reads only unsent rows above it."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug

_last = {"id": 0}       # lives as long as the relay's process


def relay_once(db, r, queue, pause, batch=100):
    # BUG: "rows below what I published are done": a smaller id that commits
    # after a larger one was published stays unsent below the mark for ever
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 AND id > ?"
                    " ORDER BY id LIMIT ?", (_last["id"], batch))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
        _last["id"] = outbox_id
    return len(rows)
