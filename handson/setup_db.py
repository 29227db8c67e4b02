"""A fresh results database: the seed's three tables plus the `applied` ledger.

`applied` gets one row per effect, written in the same transaction as the effect,
so the chaos run can count how many times each job really changed the database.

    python -m handson.setup_db [results.db]
"""

import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

SCHEMA = """
CREATE TABLE scores(job_id TEXT PRIMARY KEY, doc_id INT, score REAL);
CREATE TABLE scores_naive(job_id TEXT, doc_id INT, score REAL);
CREATE TABLE stats(n INT); INSERT INTO stats VALUES (0);
CREATE TABLE applied(job_id TEXT, attempt INT, pid INT, t INT);
"""
T = TypeVar("T")


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
    # A view or trigger in a file a learner wrote runs no function with side
    # effects here (`handson.infra.trusted_read` checks the tables themselves).
    db.execute("PRAGMA trusted_schema=OFF")
    return db


def _wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch the file to WAL once (it stays so). Two processes switching a new
    file at the same moment can be told "locked" without the busy wait."""
    def switch() -> None:
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode=WAL")
    retrying(switch, timeout)


def retrying(call: Callable[[], T], timeout: float = 30.0) -> T:
    """`call()`, again while SQLite says the file is busy in a way its own busy
    wait does not cover, until `timeout` s have passed.

    Besides the WAL switch above, a reader can be told "locking protocol"
    (SQLITE_PROTOCOL): it lost the race for the WAL index some hundred times in
    a row, as happens beside writers killed with kill -9 on a loaded machine.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except sqlite3.OperationalError as err:
            transient = "locked" in str(err) or "locking protocol" in str(err)
            if not transient or time.monotonic() > deadline:
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
