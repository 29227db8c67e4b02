"""The points job killed between each two of its round trips.

award_points keeps its effect (a ledger row) in the same database as its
claim, so one transaction makes the job exactly-once. The replay matrix kills
it at the points the learner names; here it is killed after each of its SQL
statements (`handson.round_trips`), named point or not, then delivered again
inside the lease and once more after it, as the matrix's points case does.
One ledger row and one completed record must remain.

Each job is also stopped after each statement while the same delivery runs
in another host (`with_rivals`), and one host makes a worker's day of
deliveries on one connection (`one_worker`): per-connection state that a
fresh process per delivery would hide shows there.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from dataclasses import dataclass

from handson import confirmation_job
from handson.effects import claims
from handson.effects.mailer import open_mailer
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
FIX_MAIL_RIVAL = ("claim first (INSERT ... ON CONFLICT DO NOTHING RETURNING id) "
                  "and send only if that statement gave this run the row; a "
                  "lookup before the claim, or an insert whose result is not "
                  "read, lets two deliveries at once both send")
RIVAL_RAN = ("meanwhile the same delivery ran to its end in another worker; "
             "then the first went on")


class Mailbox:
    """The provider's store for the hosts' emails, in the harness's folder
    (no host sees it); each send reaches it through a `Caller`."""

    def __init__(self, workdir: str, provider: str):
        fd, path = tempfile.mkstemp(prefix="mailbox-", suffix=".sqlite",
                                    dir=workdir)
        os.close(fd)
        self.mailer = open_mailer(provider, path)
        self.caller = remote_module.Caller(self.mailer, ("send", "lookup"),
                                           ("kind", "takes_reference"))

    def sent(self) -> int:
        return self.mailer.count()


def _one_email(mail: Mailbox, db: Database) -> str:
    recs = [r.status for r in claims.records(db, confirmation_job.JOB_TYPE)]
    if mail.sent() == 1 and recs == ["completed"]:
        return ""
    return f"{mail.sent()} email(s), record {recs or 'none'}"


def _fresh_mail(target: str, mail: Mailbox):
    tables = _fresh(target)

    def fresh() -> Database:
        mail.mailer.clear()
        return tables()
    return fresh


def _scenes(target: str, learner, other, ldb, rdb, mail: Mailbox,
            key: str, now: float) -> dict:
    """The three runs, by name, each a callable."""
    lease = confirmation_job.LEASE_S
    points = Scene("award_points", lambda db: None,
                   lambda: learner.award_points(ldb, key, now, lease, PAUSE),
                   lambda db: _points_once(db, key), RIVAL_RAN, FIX_RIVAL,
                   rival=lambda: other.award_points(rdb, key, now, lease, PAUSE))
    email = Scene("send_confirmation", lambda db: None,
                  lambda: learner.send_confirmation(ldb, mail.caller, key, now,
                                                    lease, PAUSE),
                  lambda db: _one_email(mail, db), RIVAL_RAN, FIX_MAIL_RIVAL,
                  rival=lambda: other.send_confirmation(rdb, mail.caller, key,
                                                        now, lease, PAUSE))
    return {
        "interleaved": (points.fn, lambda: run_scenes(
            Stores(_fresh(target), TABLES), learner, [points], each=each_stop)),
        "confirmation_interleaved": (email.fn, lambda: run_scenes(
            Stores(_fresh_mail(target, mail), TABLES), learner, [email],
            each=each_stop)),
        "one_worker": ("the deliveries", lambda: one_worker(
            learner, ldb, _fresh_mail(target, mail), mail, key, now, target))}


def with_rivals(target: str, job: str, key: str, now: float, workdir: str,
                provider: str = "plain") -> dict:
    """Two hosts of the learner's module for each of three runs: each job
    stopped after each of its SQL statements while the same delivery runs to
    its end in the other host
    ("interleaved": award_points, "confirmation_interleaved":
    send_confirmation), then one worker's deliveries on one connection
    ("one_worker", `one_worker`); plain data for each. Each run starts on
    new processes, so nothing one leaves behind is blamed on the next; one
    that leaves a transaction open fails for it."""
    try:
        learner, other = hosts(target, job, "your job", 2)
    except Unrunnable as err:
        return {name: {"error": str(err)} for name in
                ("interleaved", "confirmation_interleaved", "one_worker")}
    ldb, rdb = database(target), database(target, RIVAL_WAIT_S)
    mail = Mailbox(workdir, provider)
    out = {}
    try:
        for name, (fn, run) in _scenes(target, learner, other, ldb, rdb, mail,
                                       key, now).items():
            if out:             # their next calls start new processes: no
                learner.close()     # connection, no transaction, nothing
                other.close()       # of the run before carries on
            out[name] = run()
            if left_open(target):
                out[name] = _left_open(out[name], fn)
        return out
    finally:
        learner.close()
        other.close()
        mail.mailer.close()


FIX_OPEN = ("end every transaction you begin on every path, ROLLBACK when the "
            "work raises (`with db.transaction():` does both): a worker keeps "
            "its connection, and a transaction left open holds the write lock "
            "and carries into its next delivery")


def left_open(target: str) -> bool:
    """Whether a connection still holds a transaction: the write lock, or a
    read one that keeps the log from being emptied. Once the learner's calls
    have returned, nothing of theirs may hold either."""
    db = Database(target, RIVAL_WAIT_S)
    try:
        db.run("BEGIN IMMEDIATE")
        db.run("ROLLBACK")
        return db.query("PRAGMA wal_checkpoint(TRUNCATE)")[0][0] != 0
    except sqlite3.OperationalError:
        return True
    finally:
        db.close()


def _left_open(data: dict, fn: str) -> dict:
    """A run that passed but left the write lock held fails for that."""
    if data.get("error") or data.get("failed"):
        return data
    return {"kills": data["kills"], "failed": {
        "function": fn, "round_trip": sum(data["kills"].values()),
        "schedule": f"once {fn} had returned, its worker's connection still held "
                    "a transaction open: the database stayed locked",
        "fix": FIX_OPEN}}


# --- one long-running worker --------------------------------------------------

OTHER_KEY = "ORD-1002"
FIX_CONNECTION = ("decide from what THIS call's statements return (the "
                  "RETURNING row of your claim, changes() right after it, a "
                  "transaction that rolls back when the work raises), never from "
                  "what the connection remembers (last_insert_rowid(), "
                  "total_changes(), a cached row, a transaction left open): a "
                  "worker keeps one connection for every delivery")
FIX_DIED = ("a worker lives through every delivery: your job ended its process "
            "(a crash, an exit, or no answer in time) where it should have "
            "returned or raised")
JOBS = {"send_confirmation": confirmation_job.JOB_TYPE,
        "award_points": confirmation_job.POINTS_JOB}


class FailAt:
    """The pause callback of an attempt whose work raises at `point`."""

    def __init__(self, point: str):
        self.point, self.fired = point, False

    def __call__(self, at: str) -> None:
        if at == self.point:
            self.fired = True
            raise RuntimeError(f"the work failed at {at!r} (the grader's fault)")


@dataclass
class Delivery:
    fn: str
    key: str
    at: float           # seconds after the first delivery
    what: str           # why this delivery is here, in the learner's words
    fail_at: str = ""   # the point where its work raises


def deliveries(key: str) -> list[Delivery]:
    """A worker's day: each job again after its own success, another order,
    and an attempt that fails after its effect, then comes again."""
    return [
        Delivery("send_confirmation", key, 0, "the first delivery"),
        Delivery("send_confirmation", key, 60, "the same message again after "
                 "its own success"),
        Delivery("send_confirmation", OTHER_KEY, 1, "a different order"),
        Delivery("award_points", key, 0, "the first delivery"),
        Delivery("award_points", key, 60, "the same message again after its "
                 "own success"),
        Delivery("award_points", OTHER_KEY, 1, "an attempt whose work raised "
                 "after the ledger row", "after-effect"),
        Delivery("award_points", OTHER_KEY, 2, "the same message again after "
                 "its own failure")]


def _left(db: Database, mail: Mailbox, keys) -> dict:
    """(job, key) -> (its emails or ledger rows, its record's status)."""
    out = {}
    for fn, job in JOBS.items():
        status = {r.operation_key: r.status for r in claims.records(db, job)}
        for k in keys:
            n = (mail.mailer.count(k) if fn == "send_confirmation"
                 else confirmation_job.ledger(db, k))
            out[fn, k] = (n, status.get(k, "none"))
    return out


def _off(left: dict, done: set, tried: set) -> str:
    """What exactly-once forbids: an effect twice; none, or a record not
    completed, for a delivery that finished; an effect nobody asked for. A
    failed attempt may leave its effect (it may have committed before it
    failed); then the redelivery must not add another."""
    parts = []
    for (fn, k), (n, status) in left.items():
        what = "email(s)" if fn == "send_confirmation" else "ledger row(s)"
        if (fn, k) in done:
            if n != 1:
                parts.append(f"{n} {what} for {k} where 1 was due")
            elif status != "completed":
                parts.append(f"the {fn} record of {k} {status} where completed "
                             "was due")
        elif (fn, k) in tried and n > 1:
            parts.append(f"{n} {what} for {k} where at most 1 was due")
        elif (fn, k) not in tried and n:
            parts.append(f"{n} {what} for {k} where none was due")
    return " and ".join(parts)


def _said(d: Delivery, n: int, now: float) -> str:
    return f"delivery {n} ({d.fn} {d.key} at +{d.at - now:g} s: {d.what})"


def _deliver(learner, ldb, mail: Mailbox, d: Delivery) -> tuple[str, bool]:
    """One delivery: (what went wrong in it, whether its work failed as the
    grader made it); the host's death is what went wrong too."""
    pause = FailAt(d.fail_at) if d.fail_at else confirmation_job._no_pause
    args = (ldb, mail.caller) if d.fn == "send_confirmation" else (ldb,)
    try:
        getattr(learner, d.fn)(*args, d.key, d.at, confirmation_job.LEASE_S,
                               remote_module.Caller(pause, name="pause"))
    except remote_module.LearnerError as err:
        if not (d.fail_at and pause.fired):
            return f"raised {type(err).__name__}: {err}", False
    except remote_module.LearnerProcessDied as err:
        return f"ended its worker: {err}", False
    return "", bool(d.fail_at and pause.fired)


def one_worker(learner, ldb, fresh, mail: Mailbox, key: str, now: float,
               target: str) -> dict:
    """The deliveries one after another in ONE host on ONE connection, as a
    long-running worker makes them; after each, every effect once and no
    transaction left open: {"kills": {"deliveries": n}, "failed"} (the
    round-trip checks' shape) or {"error"}."""
    try:
        db = fresh()
    except sqlite3.Error as err:
        return {"error": "the deliveries on one connection could not start: the "
                         f"database stayed locked ({err}) after the runs before"}
    done: set = set()
    tried: set = set()
    said: list[str] = []
    try:
        for n, d in enumerate(deliveries(key), 1):
            d.at += now
            problem, failed = _deliver(learner, ldb, mail, d)
            tried.add((d.fn, d.key))
            if not failed:
                done.add((d.fn, d.key))
            if not problem and left_open(target):
                problem = ("returned with a transaction still open on the "
                           "worker's connection (the database stayed locked)")
            if not problem:
                off = _off(_left(db, mail, (key, OTHER_KEY)), done, tried)
                problem = off and f"left {off}"
            if problem:
                return _broke(said, d, _said(d, n, now), problem)
            said.append(_said(d, n, now))
    finally:
        db.close()
    return {"kills": {"deliveries": len(said)}, "failed": None}


def _broke(before: list[str], d: Delivery, this: str, problem: str) -> dict:
    ran = (f"{len(before)} deliver{'ies' if len(before) > 1 else 'y'}, the "
           f"last {before[-1]}," if before else "nothing")
    fix = (FIX_OPEN if "still open" in problem else
           FIX_DIED if problem.startswith("ended") else FIX_CONNECTION)
    return {"kills": {"deliveries": len(before)}, "failed": {
        "function": d.fn, "round_trip": len(before) + 1,
        "schedule": f"one worker kept one connection across deliveries, as a "
                    f"long-running worker does: after {ran} on that "
                    f"connection, {this} {problem}",
        "fix": fix}}
