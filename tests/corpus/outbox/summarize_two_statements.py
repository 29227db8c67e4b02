"""Broken on purpose: the consumer's key and its effect commit separately."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def summarize(db, doc_id):
    # BUG: no transaction: a consumer killed after the key is written never
    # applies the effect, and the redelivery finds the key and skips it
    if not db.query("INSERT INTO summarized (doc_id) VALUES (?)"
                    " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                    (doc_id,)):
        return False
    db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
