"""A fresh results database: the seed's three tables plus the `applied` ledger.

`applied` gets one row per effect, written in the same transaction as the effect,
so the chaos run can count how many times each job really changed the database.

    python -m handson.setup_db [results.db]
"""

import sqlite3
import sys
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE scores(job_id TEXT PRIMARY KEY, doc_id INT, score REAL);
CREATE TABLE scores_naive(job_id TEXT, doc_id INT, score REAL);
CREATE TABLE stats(n INT); INSERT INTO stats VALUES (0);
CREATE TABLE applied(job_id TEXT, attempt INT, pid INT, t INT);
"""


def connect(path: str | Path, timeout: float = 30.0) -> sqlite3.Connection:
    """Autocommit connection in WAL mode, waiting up to `timeout` s on locks.

    Every SQLite file of the lab opens here: WAL lets many worker processes
    write safely, and NORMAL sync still keeps a commit through a SIGKILL (it is
    in the OS at once; only a power cut needs the fsync NORMAL skips).
    """
    db = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    _wal(db, timeout)
    db.execute("PRAGMA synchronous=NORMAL")
    return db


def _wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch the file to WAL once (it stays so). Two processes switching a new
    file at the same moment can be told "locked" without the busy wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


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
