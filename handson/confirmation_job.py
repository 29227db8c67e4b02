"""The seed's job: send one confirmation email per order, with a claim and a lease.

    run:   claim (INSERT ... ON CONFLICT DO NOTHING RETURNING id)
           send the email
           mark completed
    skip:  no row came back, so read the record:
           completed                    -> stop
           claimed, younger than lease  -> stop, another run is on it
           claimed, older than lease    -> apply the stale-claim policy

The email leaves through a provider that is not in the job's database, so a
run that dies between the send and the status change leaves a claim that looks
exactly like one that died before the send. What happens then is a policy,
chosen in advance; the four below are the choices for this job.

As a worker process (what the replay matrix starts and kills):

    python -m handson.confirmation_job --db TARGET --mailbox FILE --key ORD-1001 \
        --now 1000 --policy hold [--provider plain] [--pause-at after-claim]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

from handson.effects import claims
from handson.effects.mailer import PlainMailer, open_mailer
from handson.effects.sqldb import Database, is_postgres
from handson.infra import learner_module, remote_module
from handson.infra.worker_process import stop_at, wait_gate

JOB_TYPE = "send_confirmation"
LEASE_S = 10 * 60.0     # the lease: ten minutes ...
LONGEST_RUN_S = 90.0    # ... longer than the job's longest normal run
POINTS_JOB = "award_points"
PAUSE_POINTS = ("after-claim", "after-email", "after-effect")
LEDGER = "points_ledger"
LEDGER_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {LEDGER} (
  n {{id_pk}}, order_key TEXT NOT NULL, points INTEGER NOT NULL)"""

Pause = Callable[[str], None]


class PolicyUnavailable(RuntimeError):
    """The chosen policy needs something this provider does not offer."""


def _no_pause(point: str) -> None:
    return None


def setup(db: Database, fresh: bool = False) -> None:
    """The claim tables and the points ledger, emptied if `fresh`."""
    claims.setup(db, fresh)
    if fresh:
        db.drop(LEDGER)
    db.run(LEDGER_SCHEMA.format(id_pk=db.id_pk))


def ledger(db: Database, key: str) -> int:
    """Rows in the points ledger for one order."""
    return db.query(f"SELECT count(*) FROM {LEDGER} WHERE order_key = ?",
                    (key,))[0][0]


def send_email(mailer: PlainMailer, key: str) -> None:
    subject = f"Your order {key} is confirmed"
    body = f"Thank you for order {key}."
    if mailer.takes_reference:
        mailer.send("customer@example.com", subject, body, reference=key)
    else:
        mailer.send("customer@example.com", subject, body)


def send_and_complete(db, mailer, op_id: int, key: str, now: float,
                      pause: Pause) -> None:
    """The owned part of the job: the email, then the status change."""
    send_email(mailer, key)
    pause("after-email")
    claims.complete(db, op_id, now)


# The four stale-claim policies. Each is called with a record that the database
# says is claimed and older than the lease, and returns what it did.

def hold_for_person(db, mailer, rec, now, pause) -> str:
    claims.hold(db, rec, now)
    return "held"


def accept_duplicate(db, mailer, rec, now, pause) -> str:
    if not claims.take_over(db, rec, now):
        return "skip:taken-over"
    send_and_complete(db, mailer, rec.id, rec.operation_key, now, pause)
    return "resent"


def accept_miss(db, mailer, rec, now, pause) -> str:
    return "given-up" if claims.give_up(db, rec, now) else "skip:taken-over"


def look_up_by_reference(db, mailer, rec, now, pause) -> str:
    if not claims.take_over(db, rec, now):
        return "skip:taken-over"
    if mailer.lookup(rec.operation_key):
        claims.complete(db, rec.id, now)
        return "found"
    send_and_complete(db, mailer, rec.id, rec.operation_key, now, pause)
    return "sent-after-lookup"


POLICIES = {
    "hold": hold_for_person,
    "duplicate": accept_duplicate,
    "miss": accept_miss,
    "lookup": look_up_by_reference,
}


def check_policy(policy: str, mailer: PlainMailer) -> None:
    """Refuse, before any work, a policy this provider cannot support."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from "
                         f"{', '.join(POLICIES)}")
    if policy == "lookup" and not hasattr(mailer, "lookup"):
        raise PolicyUnavailable(f"the {mailer.kind} provider takes no reference "
                                "and cannot be asked; 'lookup' is not available")


def send_confirmation(db: Database, mailer: PlainMailer, key: str, now: float,
                      policy: str = "hold", lease_s: float = LEASE_S,
                      pause: Pause = _no_pause) -> str:
    """One delivery of the job for order `key`; returns what this run did."""
    check_policy(policy, mailer)
    op_id = claims.claim(db, JOB_TYPE, key, now)
    if op_id is not None:
        pause("after-claim")
        send_and_complete(db, mailer, op_id, key, now, pause)
        return "sent"
    rec = claims.record(db, JOB_TYPE, key)
    state = claims.judge(rec, now, lease_s)
    if state != "stale":
        return f"skip:{state}"
    return POLICIES[policy](db, mailer, rec, now, pause)


def award_points(db: Database, key: str, now: float, lease_s: float = LEASE_S,
                 pause: Pause = _no_pause, points: int = 10) -> str:
    """A job whose effect is a row in the same database: one transaction.

    The claim, the ledger row and the status change commit together, so a run
    killed anywhere inside leaves nothing, and the redelivery simply claims.
    There is no uncertain case and no policy to choose.
    """
    with db.transaction():
        op_id = claims.claim(db, POINTS_JOB, key, now)
        if op_id is not None:
            pause("after-claim")
            db.run(f"INSERT INTO {LEDGER} (order_key, points) VALUES (?, ?)",
                   (key, points))
            pause("after-effect")
            claims.complete(db, op_id, now)
    if op_id is not None:
        return "applied"
    return f"skip:{claims.judge(claims.record(db, POINTS_JOB, key), now, lease_s)}"


# --- the worker process -------------------------------------------------------

def _run(a, db: Database, mailer: PlainMailer, pause: Pause):
    """The reference job with the CLI's policy, or the learner's with its own.

    Under the grader the learner's module runs in a host process of its own
    (`remote_module`): it opens the same database itself, and the mail
    provider and the pause callback stay here, called back over the pipe, so
    the learner's code never touches the provider's store and never speaks
    for this worker.
    """
    fn = "send_confirmation" if a.task == "confirmation" else "award_points"
    if a.job:
        job = remote_module.load_learner(a.job, (fn,), "your job")
        if isinstance(job, remote_module.RemoteModule):
            target = a.db if is_postgres(a.db) else os.path.abspath(a.db)
            db = remote_module.Local("course_object", module=Database.__module__,
                                     name=Database.__name__, args=[target])
            mailer = remote_module.Caller(mailer, ("send", "lookup"),
                                          ("kind", "takes_reference"))
            pause = remote_module.Caller(pause, name="pause")
        if a.task == "points":
            return job.award_points(db, a.key, a.now, a.lease, pause)
        return job.send_confirmation(db, mailer, a.key, a.now, a.lease, pause)
    if a.task == "points":
        return award_points(db, a.key, a.now, a.lease, pause)
    return send_confirmation(db, mailer, a.key, a.now, a.policy, a.lease, pause)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one delivery of send_confirmation")
    p.add_argument("--db", required=True, help="SQLite file or PostgreSQL URL")
    p.add_argument("--mailbox", required=True, help="the provider's own store")
    p.add_argument("--job", help="a learner's module to run instead of this one "
                   "(its send_confirmation / award_points; its POLICY)")
    p.add_argument("--task", choices=("confirmation", "points"),
                   default="confirmation")
    p.add_argument("--provider", default="plain", choices=("plain", "reference"))
    p.add_argument("--key", default="ORD-1001")
    p.add_argument("--now", type=float, required=True, help="the injected clock")
    p.add_argument("--policy", default="hold", choices=tuple(POLICIES))
    p.add_argument("--lease", type=float, default=LEASE_S)
    p.add_argument("--pause-at", choices=PAUSE_POINTS)
    p.add_argument("--gate-fd", type=int, help="wait for a byte on this fd first")
    p.add_argument("--work-s", type=float, default=0.0,
                   help="seconds the work takes between claim and email")
    p.add_argument("--limit-s", type=float, default=30.0)
    a = p.parse_args(argv)
    mailer = open_mailer(a.provider, a.mailbox)
    pause = stop_at(a.pause_at, limit_s=a.limit_s)
    if a.work_s:
        inner = pause

        def pause(point: str) -> None:  # noqa: F811 - the job's own slow work
            if point == "after-claim":
                time.sleep(a.work_s)
            inner(point)
    with Database(a.db) as db:
        setup(db)
        if a.gate_fd is not None:
            wait_gate(a.gate_fd, a.limit_s)
        try:
            outcome = _run(a, db, mailer, pause)
        except (PolicyUnavailable, learner_module.ModuleProblem) as err:
            print(json.dumps({"error": str(err)}), flush=True)
            return 2
    print(json.dumps({"outcome": str(outcome), "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
