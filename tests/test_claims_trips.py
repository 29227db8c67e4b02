"""The points job killed after each of its SQL statements, where no pause marks
the gap, then delivered again: on a real SQLite file and a real host process
killed with SIGKILL."""

import shutil

import pytest

from autograder.judges import corpus, idempotent_claims
from handson import claims_trips, replay_matrix
from handson.effects.sqldb import Database
from handson.round_trips import Scene, Stores, each_stop, run_scenes

FOLDER = corpus.ROOT / "claims"


def _killed(tmp_path, name: str) -> dict:
    for f in {name, corpus.BASE}:
        shutil.copy(FOLDER / f, tmp_path / f)
    return claims_trips.killed_between_trips(
        str(tmp_path / "jobs.sqlite"), str(tmp_path / name), replay_matrix.KEY,
        (replay_matrix.T0, replay_matrix.INSIDE_LEASE, replay_matrix.AFTER_LEASE))


@pytest.mark.parametrize("name", ["correct.py", "alt_duplicate.py", "alt_miss.py"])
def test_one_transaction_leaves_no_kill_of_its_own(tmp_path, name):
    """Nothing commits before the COMMIT, the last round trip: every kill is
    the same as the call never having run."""
    assert _killed(tmp_path, name) == {"kills": {"award_points": 0},
                                       "failed": None}


@pytest.mark.parametrize("name", ["points_pauses_at_the_end.py",
                                  "effect_in_two_transactions.py"])
def test_a_kill_after_the_ledger_row_applies_the_points_twice(tmp_path, name):
    data = _killed(tmp_path, name)
    bad = data["failed"]
    assert bad["round_trip"] == 2 and bad["fix"] == claims_trips.FIX, data
    assert bad["schedule"].startswith(
        "award_points killed (SIGKILL) after round trip 2 of 3 (SQL INSERT INTO "
        "points_ledger"), bad
    assert bad["schedule"].endswith("again after it: 2 ledger row(s), record "
                                    "['completed']"), bad


def _rivals(tmp_path, name: str) -> dict:
    """The runs on the corpus's module `name`, or on one the test wrote."""
    for f in {name, corpus.BASE}:
        if not (tmp_path / f).exists():
            shutil.copy(FOLDER / f, tmp_path / f)
    return claims_trips.with_rivals(
        str(tmp_path / "jobs.sqlite"), str(tmp_path / name), replay_matrix.KEY,
        replay_matrix.T0, str(tmp_path))


@pytest.mark.parametrize("name", ["correct.py", "alt_claim_by_rowcount.py"])
def test_correct_jobs_hold_against_rivals_and_on_one_connection(tmp_path, name):
    """The claim first, in the transaction: every points stop holds the lock,
    so the rival only waits; the email's one stop (after the claim) finds the
    rival skipping; a worker's day on one connection leaves each effect once."""
    data = _rivals(tmp_path, name)
    assert data["interleaved"] == {"kills": {"award_points": 0},
                                   "failed": None}, data
    assert data["confirmation_interleaved"]["failed"] is None, data
    assert data["confirmation_interleaved"]["kills"]["send_confirmation"] >= 1
    assert data["one_worker"] == {"kills": {"deliveries": 7}, "failed": None}


def test_a_points_lookup_before_the_claim_adds_the_row_twice(tmp_path):
    """The rival, run in the lookup's gap, adds the row and the stopped call
    adds it again."""
    data = _rivals(tmp_path, "points_lookup_then_claim.py")["interleaved"]
    assert data["kills"] == {"award_points": 1}, data
    assert data["failed"]["schedule"].endswith(
        "then the first went on: 2 ledger row(s), record ['completed']"), data


def test_an_email_lookup_before_the_claim_sends_twice(tmp_path):
    data = _rivals(tmp_path, "confirmation_lookup_then_claim.py")
    bad = data["confirmation_interleaved"]["failed"]
    assert bad["fix"] == claims_trips.FIX_MAIL_RIVAL, data
    assert bad["schedule"].startswith(
        "send_confirmation stopped after round trip 1 of 4 (SQL SELECT 1 FROM "
        "handled_operations"), bad
    assert bad["schedule"].endswith(
        "meanwhile the same delivery ran to its end in another worker; then the "
        "first went on: 2 email(s), record ['completed']"), bad


def test_last_insert_rowid_on_a_kept_connection_sends_again(tmp_path):
    """A fresh connection answers 0 after the ignored insert; the worker's
    kept one answers the first delivery's id, and the email goes twice."""
    bad = _rivals(tmp_path, "confirmation_claim_by_last_rowid.py")["one_worker"][
        "failed"]
    assert bad["fix"] == claims_trips.FIX_CONNECTION
    assert bad["schedule"].endswith(
        "after 1 delivery, the last delivery 1 (send_confirmation ORD-1001 at "
        "+0 s: the first delivery), on that connection, delivery 2 "
        "(send_confirmation ORD-1001 at +60 s: the same message again after its "
        "own success) left 2 email(s) for ORD-1001 where 1 was due"), bad


@pytest.mark.parametrize("name", ["points_begin_without_rollback.py",
                                  "points_begin_error_ignored.py"])
def test_a_transaction_left_open_by_a_failed_attempt_is_seen(tmp_path, name):
    """Seen from another connection as the failed delivery returns, whether
    the next delivery would raise on its BEGIN or ignore it and go on."""
    bad = _rivals(tmp_path, name)["one_worker"]["failed"]
    assert bad["round_trip"] == 6 and bad["fix"] == claims_trips.FIX_OPEN, bad
    assert bad["schedule"].endswith(
        "delivery 6 (award_points ORD-1002 at +1 s: an attempt whose work raised "
        "after the ledger row) returned with a transaction still open on the "
        "worker's connection (the database stayed locked)"), bad


def test_a_point_after_the_commit_leaves_the_points_applied_once(tmp_path):
    """The attempt raises once its transaction committed: its one ledger row
    stays, and the redelivery, finding the record completed, adds none."""
    data = _rivals(tmp_path, "alt_points_pause_after_commit.py")
    assert data["one_worker"] == {"kills": {"deliveries": 7}, "failed": None}


def test_a_failed_attempt_may_leave_no_effect_only_if_it_comes_again():
    """Exactly-once, judged per job and key: a finished delivery's effect
    once and its record completed; a failed one's at most once."""
    send, points = ("send_confirmation", "K"), ("award_points", "K")
    assert claims_trips._off({points: (1, "completed")}, set(), {points}) == ""
    assert claims_trips._off({points: (0, "none")}, set(), {points}) == ""
    assert claims_trips._off({points: (1, "claimed")}, {points}, {points}) == (
        "the award_points record of K claimed where completed was due")
    assert claims_trips._off({send: (2, "completed")}, {send}, {send}) == (
        "2 email(s) for K where 1 was due")
    assert claims_trips._off({points: (1, "completed")}, set(), set()) == (
        "1 ledger row(s) for K where none was due")


EXITS = '''"""A job that ends its worker on one order."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *
import correct


def award_points(db, key, now, lease_s, pause):
    if key == "ORD-1002":
        os._exit(3)
    return correct.award_points(db, key, now, lease_s, pause)
'''


def test_a_worker_that_dies_loses_the_delivery_it_died_in(tmp_path):
    """Not a traceback that takes every check with it: the delivery, and how
    the process ended."""
    (tmp_path / "exits.py").write_text(EXITS)
    data = _rivals(tmp_path, "exits.py")
    assert data["interleaved"]["failed"] is None, data
    assert data["confirmation_interleaved"]["failed"] is None, data
    bad = data["one_worker"]["failed"]
    assert bad["fix"] == claims_trips.FIX_DIED, bad
    assert bad["schedule"].endswith(
        "delivery 6 (award_points ORD-1002 at +1 s: an attempt whose work raised "
        "after the ledger row) ended its worker: your job's process exited with "
        "code 3 during award_points()"), bad


SAVEPOINT = '''"""A points job whose savepoint stays open when a statement fails."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *


def award_points(db, key, now, lease_s, pause):
    db.run("SAVEPOINT award")
    op_id = claim(db, POINTS_JOB, key, now)
    if op_id is not None:
        pause("after-claim")
        db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, ?)",
               (key, 10))
        pause("after-effect")
        complete(db, op_id, now)
    db.run("RELEASE award")
    return "applied" if op_id is not None else "skip"
'''


def test_what_one_run_leaves_open_is_not_blamed_on_the_next(tmp_path):
    """The rival's savepoint, left open when the stopped call's lock refused
    its insert, once carried into the email run and locked it there."""
    (tmp_path / "savepoint.py").write_text(SAVEPOINT)
    data = _rivals(tmp_path, "savepoint.py")
    assert data["confirmation_interleaved"]["failed"] is None, data
    assert data["one_worker"]["failed"]["fix"] == claims_trips.FIX_OPEN, data


def test_a_database_left_locked_is_said_not_raised(tmp_path):
    """A fresh start that finds the write lock held ends the run with one
    line naming the function, not a traceback."""
    target = str(tmp_path / "jobs.sqlite")
    holder = Database(target)
    holder.run("CREATE TABLE t (x)")
    holder.run("BEGIN IMMEDIATE")
    try:
        def fresh():
            db = Database(target, 0.1)
            db.drop("t")
            return db
        scene = Scene("award_points", lambda db: None, lambda: None,
                      lambda db: "", "", "")
        got = run_scenes(Stores(fresh, ("t",)), None, [scene], each=each_stop)
    finally:
        holder.run("ROLLBACK")
        holder.close()
    assert got["error"].startswith(
        "award_points: the database stayed locked after a run (database is "
        "locked)"), got


HIDDEN = '''"""An email job that claims on a connection of its own."""
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *

PATH = str(Path(__file__).with_name("jobs.sqlite"))


def send_confirmation(db, mailer, key, now, lease_s, pause):
    side = sqlite3.connect(PATH, isolation_level=None)
    try:
        took = side.execute(
            "INSERT INTO handled_operations (job_type, operation_key, status,"
            " claimed_at) VALUES (?, ?, 'claimed', ?) ON CONFLICT DO NOTHING"
            " RETURNING id", (JOB_TYPE, key, now)).fetchall()
        if not took:
            return "skip"
        send_email(mailer, key)
        side.execute("UPDATE handled_operations SET status = 'completed'"
                     " WHERE id = ?", (took[0][0],))
    finally:
        side.close()
    return "sent"
'''


def test_an_email_job_on_a_connection_of_its_own_is_refused(tmp_path):
    """No statement the host could count, so no stop: said so, as the kills
    say it, not passed as a job that held its transaction."""
    (tmp_path / "hidden.py").write_text(HIDDEN)
    data = _rivals(tmp_path, "hidden.py")["confirmation_interleaved"]
    assert data["error"].startswith(
        "send_confirmation changed the database, yet its host counted no SQL "
        "round trip"), data


def test_the_grade_names_the_kill_and_the_fix():
    check = next(c for c in idempotent_claims.CHECKS
                 if c.name == "killed_between_round_trips")
    bad = {"schedule": "award_points killed after round trip 2", "fix": "one tx"}
    outs = {o.name: o for o in idempotent_claims.judge(
        {"round_trips": {"kills": {"award_points": 2}, "failed": bad}}, "hold")}
    out = outs[check.name]
    assert not out.ok and out.message == "one tx" and out.got == bad["schedule"]
    outs = {o.name: o for o in idempotent_claims.judge(
        {"round_trips": {"error": "award_points: ValueError: no"}}, "hold")}
    assert outs[check.name].message == "award_points: ValueError: no"


def test_postgres_is_refused_in_one_line_before_anything_runs(tmp_path):
    """Its statements are not counted, so no kill could be placed: said, not
    passed."""
    from handson.round_trips import SQLITE_ONLY

    got = claims_trips.killed_between_trips(
        "postgresql://nobody@127.0.0.1:1/none", str(tmp_path / "absent.py"),
        replay_matrix.KEY, (0.0, 1.0, 2.0))
    assert got == {"error": SQLITE_ONLY}
