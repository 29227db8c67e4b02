"""Broken on purpose: the consumer reads the keys once per connection and
checks new deliveries against that copy."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug

_summarized = {}        # per connection: the keys it has seen


def summarize(db, doc_id):
    # BUG: "one query per connection, not per job": another worker's
    # connection commits keys this copy never learns of
    seen = _summarized.get(id(db))
    if seen is None:
        seen = _summarized[id(db)] = {
            d for (d,) in db.query("SELECT doc_id FROM summarized")}
    if doc_id in seen:
        return False
    with db.transaction():
        db.run("INSERT INTO summarized (doc_id) VALUES (?)"
               " ON CONFLICT (doc_id) DO NOTHING", (doc_id,))
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    seen.add(doc_id)
    return True
