"""Broken on purpose: the document and its outbox row commit separately."""


def save_document(db, doc_id, body, pause):
    # BUG: each insert commits alone; a handler killed between them leaves a
    # document that no message will ever announce
    db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
    pause("between", doc_id)
    db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
    return len(rows)


def summarize(db, doc_id):
    with db.transaction():
        if not db.query("INSERT INTO summarized (doc_id) VALUES (?)"
                        " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                        (doc_id,)):
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
