"""Two mail providers: stand-ins for the system the job cannot share a transaction with.

Each keeps its own store (a SQLite file of its own, not the job's database) and
commits every message before `send` returns, so a worker killed the instant
after sending leaves the message behind, as a real provider would.

- `PlainMailer` sends and counts. It takes no reference and cannot be asked
  whether a message went out: the job's only memory is its own table.
- `ReferenceMailer` also takes a reference with each message and answers
  `lookup(reference)`, which is what makes the "look up by reference" policy
  possible.

The counts are for the lab and the tests (the provider's dashboard), never for
the job.
"""

from __future__ import annotations

from handson import setup_db

_SCHEMA = """CREATE TABLE IF NOT EXISTS sent (
  n INTEGER PRIMARY KEY, recipient TEXT, subject TEXT, body TEXT, reference TEXT)"""


class PlainMailer:
    """Sends and counts. No reference field, no lookup."""

    kind = "plain"
    takes_reference = False

    def __init__(self, path: str):
        self.path = path
        self._conn = setup_db.connect(path, timeout=10.0)
        self._conn.execute(_SCHEMA)

    def send(self, to: str, subject: str, body: str) -> None:
        self._store(to, subject, body, None)

    def _store(self, to, subject, body, reference) -> None:
        # autocommit: the message is in the provider's file when this returns
        self._conn.execute("INSERT INTO sent (recipient, subject, body, reference)"
                           " VALUES (?, ?, ?, ?)", (to, subject, body, reference))

    def count(self, subject_contains: str = "") -> int:
        """Messages sent so far (the provider's dashboard, not the job's view)."""
        (n,) = self._conn.execute("SELECT count(*) FROM sent WHERE subject LIKE ?",
                                  (f"%{subject_contains}%",)).fetchone()
        return n

    def clear(self) -> None:
        """Forget every message: one store serves a grader's runs one by one."""
        self._conn.execute("DELETE FROM sent")

    def close(self) -> None:
        self._conn.close()


class ReferenceMailer(PlainMailer):
    """Takes a reference with each message and can be asked about it."""

    kind = "reference"
    takes_reference = True

    def send(self, to: str, subject: str, body: str,  # type: ignore[override]
             reference: str) -> None:
        self._store(to, subject, body, reference)

    def lookup(self, reference: str) -> bool:
        """Did a message with this reference go out?"""
        row = self._conn.execute("SELECT 1 FROM sent WHERE reference = ? LIMIT 1",
                                 (reference,)).fetchone()
        return row is not None


PROVIDERS = {"plain": PlainMailer, "reference": ReferenceMailer}


def open_mailer(kind: str, path: str) -> PlainMailer:
    try:
        return PROVIDERS[kind](path)
    except KeyError:
        raise ValueError(f"unknown mail provider {kind!r}; choose from "
                         f"{', '.join(PROVIDERS)}") from None
