"""The points job killed between each two of its round trips.

award_points keeps its effect (a ledger row) in the same database as its
claim, so one transaction makes the job exactly-once. The replay matrix kills
it at the points the learner names; here it is killed after each of its SQL
statements (`handson.round_trips`), named point or not, then delivered again
inside the lease and once more after it, as the matrix's points case does.
One ledger row and one completed record must remain.
"""

from __future__ import annotations

from handson import confirmation_job
from handson.effects import claims
from handson.effects.sqldb import Database
from handson.infra import remote_module
from handson.round_trips import (
    RIVAL_WAIT_S,
    Scene,
    Stores,
    Unrunnable,
    database,
    each_stop,
    hosts,
    run_scenes,
)

FIX = ("claim, write the ledger row and mark the record completed in ONE "
       "transaction (`with db.transaction():`): a worker killed after any "
       "statement must leave all three or none, so the redelivery applies the "
       "points once")


def _points_once(db: Database, key: str) -> str:
    rows = confirmation_job.ledger(db, key)
    recs = [r.status for r in claims.records(db, confirmation_job.POINTS_JOB)]
    if rows == 1 and recs == ["completed"]:
        return ""
    return f"{rows} ledger row(s), record {recs or 'none'}"


def _fresh(target: str):
    def fresh() -> Database:
        db = Database(target)
        confirmation_job.setup(db, fresh=True)
        return db
    return fresh


TABLES = (claims.TABLE, claims.HOLDS, confirmation_job.LEDGER)
PAUSE = remote_module.Caller(confirmation_job._no_pause, name="pause")


def killed_between_trips(target: str, job: str, key: str,
                         times: tuple[float, float, float]) -> dict:
    """award_points killed after each statement at times[0], then delivered
    at times[1] (inside the lease) and times[2] (after it); plain data."""
    try:
        [learner] = hosts(target, job, "your job")
    except Unrunnable as err:
        return {"error": str(err)}
    ldb = database(target)
    pause, lease = PAUSE, confirmation_job.LEASE_S

    def delivered_again(db: Database) -> str:
        for now in times[1:]:
            learner.award_points(ldb, key, now, lease, pause)
        return _points_once(db, key)

    scene = Scene("award_points", lambda db: None,
                  lambda: learner.award_points(ldb, key, times[0], lease, pause),
                  delivered_again, "the job came again inside the lease and "
                  "again after it", FIX)
    try:
        return run_scenes(Stores(_fresh(target), TABLES), learner, [scene])
    finally:
        learner.close()


FIX_RIVAL = ("take the claim first, in the same transaction as the ledger row "
             "and the status (INSERT ... ON CONFLICT DO NOTHING RETURNING inside "
             "`with db.transaction():`), never a lookup before it: two "
             "deliveries at once must add one ledger row")


def interleaved_points(target: str, job: str, key: str, now: float) -> dict:
    """award_points stopped after each of its round trips while the same
    delivery runs to its end in another host (two workers at once); one
    ledger row and a completed record must remain."""
    try:
        learner, other = hosts(target, job, "your job", 2)
    except Unrunnable as err:
        return {"error": str(err)}
    ldb, rdb = database(target), database(target, RIVAL_WAIT_S)
    lease = confirmation_job.LEASE_S
    scene = Scene("award_points", lambda db: None,
                  lambda: learner.award_points(ldb, key, now, lease, PAUSE),
                  lambda db: _points_once(db, key), "meanwhile the same "
                  "delivery ran to its end in another worker; then the first "
                  "went on", FIX_RIVAL,
                  rival=lambda: other.award_points(rdb, key, now, lease, PAUSE))
    try:
        return run_scenes(Stores(_fresh(target), TABLES), learner, [scene],
                          each=each_stop)
    finally:
        learner.close()
        other.close()
