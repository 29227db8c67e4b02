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


def with_rivals(target: str, job: str, key: str, now: float, workdir: str,
                provider: str = "plain") -> dict:
    """Two hosts of the learner's module, shared by three runs (a host's
    start is most of their cost): each job stopped after each of its SQL
    statements while the same delivery runs to its end in the other host
    ("interleaved": award_points, "confirmation_interleaved":
    send_confirmation), then one worker's deliveries on one connection
    ("one_worker", `one_worker`); plain data for each."""
    try:
        learner, other = hosts(target, job, "your job", 2)
    except Unrunnable as err:
        return {name: {"error": str(err)} for name in
                ("interleaved", "confirmation_interleaved", "one_worker")}
    ldb, rdb = database(target), database(target, RIVAL_WAIT_S)
    lease = confirmation_job.LEASE_S
    mail = Mailbox(workdir, provider)
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
    try:
        return {
            "interleaved": run_scenes(Stores(_fresh(target), TABLES), learner,
                                      [points], each=each_stop),
            "confirmation_interleaved": run_scenes(
                Stores(_fresh_mail(target, mail), TABLES), learner, [email],
                each=each_stop),
            "one_worker": one_worker(learner, ldb, _fresh_mail(target, mail),
                                     mail, key, now)}
    finally:
        learner.close()
        other.close()
        mail.mailer.close()


# --- one long-running worker --------------------------------------------------

OTHER_KEY = "ORD-1002"
FIX_CONNECTION = ("decide from what THIS call's statements return (the "
                  "RETURNING row of your claim, a transaction that rolls back "
                  "when the work raises), never from what the connection "
                  "remembers (last_insert_rowid(), changes(), a cached row, a "
                  "transaction left open): a worker keeps one connection for "
                  "every delivery")


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


def _want(done: list[Delivery], keys) -> tuple[int, dict[str, int]]:
    """Emails and ledger rows per order after the deliveries that worked."""
    emails = {d.key for d in done if d.fn == "send_confirmation"}
    points = {d.key for d in done if d.fn == "award_points"}
    return len(emails), {k: int(k in points) for k in keys}


def _left(db: Database, mail: Mailbox, keys) -> tuple[int, dict[str, int]]:
    return mail.sent(), {k: confirmation_job.ledger(db, k) for k in keys}


def _said(d: Delivery, n: int, now: float) -> str:
    return f"delivery {n} ({d.fn} {d.key} at +{d.at - now:g} s: {d.what})"


def one_worker(learner, ldb, fresh, mail: Mailbox, key: str,
               now: float) -> dict:
    """The deliveries one after another in ONE host on ONE connection, as a
    long-running worker makes them; after each, every effect once: {"kills":
    {"deliveries": n}, "failed"} (the round-trip checks' shape) or {"error"}."""
    db = fresh()
    done: list[Delivery] = []
    said: list[str] = []
    try:
        for n, d in enumerate(deliveries(key), 1):
            d.at += now
            pause = FailAt(d.fail_at) if d.fail_at else confirmation_job._no_pause
            args = (ldb, mail.caller) if d.fn == "send_confirmation" else (ldb,)
            raised = ""
            try:
                getattr(learner, d.fn)(*args, d.key, d.at, confirmation_job.LEASE_S,
                                       remote_module.Caller(pause, name="pause"))
            except remote_module.LearnerError as err:
                raised = f"{type(err).__name__}: {err}"
            failed = d.fail_at and pause.fired
            if raised and not failed:
                return _broke(said, d, _said(d, n, now), f"it raised {raised}")
            if not failed:
                done.append(d)
            want = _want(done, (key, OTHER_KEY))
            got = _left(db, mail, want[1])
            if got != want:
                return _broke(said, d, _said(d, n, now), _differ(got, want))
            said.append(_said(d, n, now))
    finally:
        db.close()
    return {"kills": {"deliveries": len(said)}, "failed": None}


def _differ(got: tuple, want: tuple) -> str:
    """Only what is off: the emails, the ledger rows, or both."""
    parts = []
    if got[0] != want[0]:
        parts.append(f"{got[0]} email(s) in all where {want[0]} were due")
    if got[1] != want[1]:
        parts.append(f"ledger rows {got[1]} where {want[1]} were due")
    return " and ".join(parts)


def _broke(before: list[str], d: Delivery, this: str, problem: str) -> dict:
    ran = (f"{len(before)} deliver{'ies' if len(before) > 1 else 'y'}, the "
           f"last {before[-1]}," if before else "nothing")
    verb = "raised" if problem.startswith("it raised") else "left"
    problem = problem.removeprefix("it raised ")
    return {"kills": {"deliveries": len(before)}, "failed": {
        "function": d.fn, "round_trip": len(before) + 1,
        "schedule": f"one worker kept one connection across deliveries, as a "
                    f"long-running worker does: after {ran} on that "
                    f"connection, {this} {verb} {problem}",
        "fix": FIX_CONNECTION}}
