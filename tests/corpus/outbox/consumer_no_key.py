"""Broken on purpose: the consumer applies its effect on every delivery."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the outbox solution; below, the one bug


def summarize(db, doc_id):
    # BUG: "the relay publishes each row once": it does not, when it is killed
    with db.transaction():
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
