"""The handled-operations table: who owns a piece of work, and since when.

One row per (job type, operation key), made unique by the database, so the
first run to insert the row owns the work and every later run finds the row
and reads it instead. A row is `claimed` (someone started) or `completed`
(the work is done). `claimed_at` comes from the caller's clock, so a test can
say "eleven minutes later" without waiting eleven minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

from handson.effects.sqldb import Database

TABLE = "handled_operations"
HOLDS = "held_operations"

SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
  id {{id_pk}},
  job_type TEXT NOT NULL,
  operation_key TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('claimed', 'completed')),
  claimed_at DOUBLE PRECISION NOT NULL,
  completed_at DOUBLE PRECISION,
  UNIQUE (job_type, operation_key))"""

# Orders parked for a person by the "hold" policy: the claim itself stays as it
# was, because the database cannot know whether the effect happened.
HOLDS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {HOLDS} (
  job_type TEXT NOT NULL,
  operation_key TEXT NOT NULL,
  held_at DOUBLE PRECISION NOT NULL,
  PRIMARY KEY (job_type, operation_key))"""


@dataclass(frozen=True)
class Record:
    id: int
    job_type: str
    operation_key: str
    status: str
    claimed_at: float


def setup(db: Database, fresh: bool = False) -> None:
    if fresh:
        db.drop(TABLE, HOLDS)
    db.run(SCHEMA.format(id_pk=db.id_pk))
    db.run(HOLDS_SCHEMA)


def claim(db: Database, job_type: str, key: str, now: float) -> int | None:
    """Insert the claim; the id if this run now owns the work, else None."""
    rows = db.query(
        f"INSERT INTO {TABLE} (job_type, operation_key, status, claimed_at) "
        "VALUES (?, ?, 'claimed', ?) "
        "ON CONFLICT (job_type, operation_key) DO NOTHING RETURNING id",
        (job_type, key, now))
    return rows[0][0] if rows else None


def record(db: Database, job_type: str, key: str) -> Record | None:
    rows = db.query(f"SELECT id, job_type, operation_key, status, claimed_at "
                    f"FROM {TABLE} WHERE job_type = ? AND operation_key = ?",
                    (job_type, key))
    return Record(*rows[0]) if rows else None


def records(db: Database, job_type: str) -> list[Record]:
    rows = db.query(f"SELECT id, job_type, operation_key, status, claimed_at "
                    f"FROM {TABLE} WHERE job_type = ? ORDER BY operation_key",
                    (job_type,))
    return [Record(*row) for row in rows]


def judge(rec: Record, now: float, lease_s: float) -> str:
    """What a run that did not get the claim should make of the record."""
    if rec.status == "completed":
        return "completed"
    if now - rec.claimed_at < lease_s:
        return "in-progress"
    return "stale"


def complete(db: Database, op_id: int, now: float) -> None:
    db.run(f"UPDATE {TABLE} SET status = 'completed', completed_at = ? "
           "WHERE id = ?", (now, op_id))


def take_over(db: Database, rec: Record, now: float) -> bool:
    """Renew a stale claim for this run; False if another run renewed it first.

    The `claimed_at = ?` condition is a compare-and-set: of two runs that both
    saw the same stale claim, exactly one changes the row.
    """
    return db.run(f"UPDATE {TABLE} SET claimed_at = ? WHERE id = ? "
                  "AND status = 'claimed' AND claimed_at = ?",
                  (now, rec.id, rec.claimed_at)) == 1


def give_up(db: Database, rec: Record, now: float) -> bool:
    """Mark a stale claim completed without doing the work (a deliberate miss)."""
    return db.run(f"UPDATE {TABLE} SET status = 'completed', completed_at = ? "
                  "WHERE id = ? AND status = 'claimed' AND claimed_at = ?",
                  (now, rec.id, rec.claimed_at)) == 1


def hold(db: Database, rec: Record, now: float) -> None:
    """Park the operation for a person; the claim row is left untouched."""
    db.run(f"INSERT INTO {HOLDS} (job_type, operation_key, held_at) "
           "VALUES (?, ?, ?) ON CONFLICT (job_type, operation_key) DO NOTHING",
           (rec.job_type, rec.operation_key, now))


def held(db: Database, job_type: str) -> list[str]:
    return [k for (k,) in db.query(f"SELECT operation_key FROM {HOLDS} "
                                   "WHERE job_type = ? ORDER BY operation_key",
                                   (job_type,))]
