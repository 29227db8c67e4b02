"""A fresh results database: the seed's three tables plus the `applied` ledger.

`applied` gets one row per effect, written in the same transaction as the effect,
so the chaos run can count how many times each job really changed the database.

    python -m handson.setup_db [results.db]
"""

import sqlite3
import sys
from pathlib import Path

SCHEMA = """
CREATE TABLE scores(job_id TEXT PRIMARY KEY, doc_id INT, score REAL);
CREATE TABLE scores_naive(job_id TEXT, doc_id INT, score REAL);
CREATE TABLE stats(n INT); INSERT INTO stats VALUES (0);
CREATE TABLE applied(job_id TEXT, attempt INT, pid INT, t INT);
"""


def connect(path: str | Path, timeout: float = 30.0) -> sqlite3.Connection:
    """Autocommit connection in WAL mode, waiting up to `timeout` s on locks."""
    db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    db.execute("PRAGMA journal_mode=WAL")   # lets many worker processes write safely
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def setup(path: str | Path) -> Path:
    """Delete `path` (and its WAL files) and create the empty tables."""
    path = Path(path)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        p.unlink(missing_ok=True)
    db = connect(path)
    db.executescript(SCHEMA)
    db.close()
    return path


if __name__ == "__main__":
    print("fresh", setup(sys.argv[1] if len(sys.argv) > 1 else "results.db"))
