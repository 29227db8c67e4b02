"""Broken on purpose: the relay publishes rows above the last id it published."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def relay_once(db, r, queue, pause, batch=100):
    # BUG: ids are taken before commit, so a smaller id can commit after a
    # larger one was published, and `id > last` skips it for ever
    (last,) = db.query("SELECT last_id FROM relay_state")[0]
    rows = db.query("SELECT id, doc_id FROM outbox WHERE id > ? ORDER BY id"
                    " LIMIT ?", (last, batch))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("UPDATE relay_state SET last_id = ?", (outbox_id,))
    return len(rows)
