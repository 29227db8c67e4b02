"""The outbox relay that reads PostgreSQL's log instead of polling the table.

A logical replication slot (`test_decoding`, read through SQL functions) hands
out every committed change in commit order and remembers how far its reader
confirmed. The relay peeks at the changes, enqueues each committed `outbox`
INSERT, and only then confirms that transaction (`pg_replication_slot_advance`
to its COMMIT). Killed between the enqueue and the confirm, it peeks the same
transaction again when it restarts: at-least-once, like the polling relay, and
for the same reason the consumer keeps a key (or an inbox). The other order,
`confirm_first` (`--loop wal-confirm-first`), is here to be measured: killed
between its confirm and its enqueue, it loses the transaction's jobs, since the
slot is the relay's only memory of what it still owes.

No `sent` flag is written and no id order is trusted: a row committed late
comes out of the slot when it commits. The relay confirms only positions it
has read (see `relay_batch`): a confirm past what it read can jump a commit
that was not yet flushed when it peeked, and that row is never published.
The price is on the server's disk: the slot keeps every WAL byte its reader
has not confirmed (`retained_wal`), so a relay that stops confirming fills
the disk until the slot is dropped.

    python -m handson.outbox relay --db URL --redis URL --loop wal
"""

from __future__ import annotations

import re
from collections.abc import Callable

from handson.effects.sqldb import Database

SLOT = "eo_outbox"
# test_decoding's line for an outbox insert, e.g.
# table public.outbox: INSERT: id[bigint]:3 doc_id[bigint]:7 sent[integer]:0
_INSERT = re.compile(r"^table \S*\boutbox: INSERT: id\[\w+\]:(\d+) "
                     r"doc_id\[\w+\]:(\d+)")


def _need_postgres(db: Database) -> None:
    if db.dialect != "postgres":
        raise ValueError("the WAL relay needs PostgreSQL (wal_level=logical); "
                         "SQLite has no replication slot")


def fresh_slot(db: Database, slot: str = SLOT) -> None:
    """Drop the slot if it exists and make a new one: changes from now on."""
    _need_postgres(db)
    db.query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
             " WHERE slot_name = ?", (slot,))
    db.query("SELECT pg_create_logical_replication_slot(?, 'test_decoding')",
             (slot,))


def ensure_slot(db: Database, slot: str = SLOT) -> None:
    _need_postgres(db)
    if not db.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = ?",
                    (slot,)):
        fresh_slot(db, slot)


def drop_slot(db: Database, slot: str = SLOT) -> None:
    db.query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
             " WHERE slot_name = ?", (slot,))


def flushed(db: Database) -> str:
    """The WAL position the server has flushed: the end of what a peek reads."""
    return db.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]


def relay_batch(db: Database, r, queue, batch: int = 100, pause=None,
                slot: str = SLOT, confirm_first: bool = False,
                end_of_log: Callable[[Database], str] = flushed) -> int:
    """Publish the outbox inserts of up to ~batch changes; confirm each
    transaction after its jobs are enqueued. Returns how many were published.

    The slot is only ever confirmed to a position this call has read:

    - each transaction's COMMIT, once its jobs are in the queue;
    - when the peek finds nothing, the end of the log read *before* the peek
      (`end_of_log`: the flush position) and given to the peek as its limit.

    Why that is safe: logical decoding reads only WAL that is flushed. The
    peek decodes from the slot until the flush position of the moment it
    starts, or until the first record that reaches its limit, whichever
    comes first; the flush position read before it is at or below the
    first. So an empty peek has decoded every record that begins before its
    limit, and no commit there is left unpublished. (Read after the peek,
    the flush position could include a commit flushed while it ran.)

    Why anything further is not: a slot confirmed to a position never hands
    out a transaction whose commit record begins before it. The write
    position (`pg_current_wal_lsn()`, what this relay used to confirm) runs
    ahead of the flush while an fsync is under way, or while the server
    writes out WAL buffers nobody has asked to flush yet. A commit in
    between is not read by the peek, is flushed a moment later, and
    `pg_replication_slot_advance` (which moves as far as the flush has got
    when it runs) puts the slot past it: a job lost with no error anywhere.
    `outbox_runs.unflushed_commit` opens that gap on purpose, with the old
    rule passed in as `end_of_log`.

    Why confirm on an empty peek at all: so that the slot moves past WAL that
    held nothing for it (other databases' transactions, checkpoints, vacuum),
    as a streaming client's keepalive does. A relay that confirmed only
    commits would keep all of that WAL for as long as its own database is
    quiet.

    `confirm_first` is the wrong order, kept to be measured: the transaction
    is confirmed before its jobs are enqueued, so a relay killed between the
    two has told the slot it owes nothing, and those jobs are never sent."""
    ensure_slot(db, slot)
    upto = end_of_log(db)
    rows = db.query("SELECT lsn::text, data FROM pg_logical_slot_peek_changes("
                    "?, ?::pg_lsn, ?, 'include-xids', '0')", (slot, upto, batch))
    if not rows:
        # Caught up to `upto`, which the peek has read through: nothing
        # committed before it is unpublished.
        _confirm(db, slot, upto)
        return 0
    published = 0
    for commit_lsn, jobs in _transactions(rows):
        if confirm_first:
            _confirm(db, slot, commit_lsn)
        for outbox_id, doc_id in jobs:
            if confirm_first and pause:
                pause("between", outbox_id)     # confirmed, not yet published
            queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
            published += 1
            if pause and not confirm_first:
                pause("between", outbox_id)     # published, not yet confirmed
        if not confirm_first:
            _confirm(db, slot, commit_lsn)
    return published


def _transactions(rows):
    """(COMMIT lsn, [(outbox id, doc id), ...]) for each transaction peeked.
    A COMMIT row's lsn is the end of its commit record, so confirming it
    covers that transaction and nothing after it."""
    jobs = []
    for lsn, data in rows:
        m = _INSERT.match(data)
        if m:
            jobs.append((int(m[1]), int(m[2])))
        elif data == "COMMIT":
            yield lsn, jobs
            jobs = []


def _confirm(db: Database, slot: str, lsn: str) -> None:
    """Tell the slot everything before `lsn` is done: it never hands it out again."""
    db.query("SELECT pg_replication_slot_advance(?, ?::pg_lsn)", (slot, lsn))


def retained_wal(db: Database, slot: str = SLOT) -> int:
    """Bytes of WAL the server keeps for this slot (from its restart point)."""
    rows = db.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)"
                    " FROM pg_replication_slots WHERE slot_name = ?", (slot,))
    return int(rows[0][0]) if rows else 0


def wal_on_disk(db: Database) -> int:
    """Bytes of WAL segment files in pg_wal, after a checkpoint recycles what
    no one needs (superuser, as on the course's throwaway server)."""
    db.run("CHECKPOINT")
    return int(db.query("SELECT coalesce(sum(size), 0) FROM pg_ls_waldir()")[0][0])
