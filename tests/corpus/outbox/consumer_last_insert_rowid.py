"""Broken on purpose: the consumer asks last_insert_rowid() whether its key
insert took."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def summarize(db, doc_id):
    with db.transaction():
        db.run("INSERT INTO summarized (doc_id) VALUES (?)"
               " ON CONFLICT (doc_id) DO NOTHING", (doc_id,))
        # BUG: an ignored insert leaves last_insert_rowid() as it was: 0 on a
        # fresh connection, the last effect's row on a worker's long-lived one
        if db.query("SELECT last_insert_rowid()")[0][0] == 0:
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
