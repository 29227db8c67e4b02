"""Broken on purpose: the consumer keeps its key in a TEMP table."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def summarize(db, doc_id):
    # BUG: "a scratch table of my own": a TEMP table lives in one connection,
    # so another worker's connection never sees the keys this one wrote
    db.run("CREATE TEMP TABLE IF NOT EXISTS done (doc_id INTEGER PRIMARY KEY)")
    with db.transaction():
        if not db.query("INSERT INTO done (doc_id) VALUES (?)"
                        " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                        (doc_id,)):
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
