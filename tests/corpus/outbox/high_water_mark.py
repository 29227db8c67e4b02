"""Broken on purpose: the relay publishes rows above the last id it published."""


def save_document(db, doc_id, body, pause):
    with db.transaction():
        db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
        pause("between", doc_id)
        db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))


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


def summarize(db, doc_id):
    with db.transaction():
        if not db.query("INSERT INTO summarized (doc_id) VALUES (?)"
                        " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                        (doc_id,)):
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
