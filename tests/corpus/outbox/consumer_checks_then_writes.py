"""Broken on purpose: the consumer looks its key up, then writes key and effect
in a transaction of their own."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def summarize(db, doc_id):
    # BUG: two consumers of one job at once both find no key, and both apply
    # the effect; delivered one after the other, or killed anywhere, it holds
    if db.query("SELECT 1 FROM summarized WHERE doc_id = ?", (doc_id,)):
        return False
    with db.transaction():
        db.run("INSERT INTO summarized (doc_id) VALUES (?)"
               " ON CONFLICT (doc_id) DO NOTHING", (doc_id,))
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
