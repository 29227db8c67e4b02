"""Broken on purpose: the document and its outbox row commit separately; the
pause comes after both, where a kill leaves them together."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def save_document(db, doc_id, body, pause):
    # BUG: each insert commits alone; a handler killed between them leaves a
    # document that no message will ever announce
    db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
    db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))
    pause("between", doc_id)
