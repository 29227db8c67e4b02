"""The points job killed after each of its SQL statements, where no pause marks
the gap, then delivered again: on a real SQLite file and a real host process
killed with SIGKILL."""

import shutil

import pytest

from autograder.judges import corpus, idempotent_claims
from handson import claims_trips, replay_matrix

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
    for f in {name, corpus.BASE}:
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
        "own success) left 2 email(s) in all where 1 were due"), bad


def test_a_transaction_left_open_by_a_failed_attempt_breaks_the_next(tmp_path):
    bad = _rivals(tmp_path, "points_begin_without_rollback.py")["one_worker"][
        "failed"]
    assert bad["round_trip"] == 7, bad
    assert "the last delivery 6 (award_points ORD-1002 at +1 s: an attempt " \
           "whose work raised after the ledger row)" in bad["schedule"], bad
    assert bad["schedule"].endswith(
        "delivery 7 (award_points ORD-1002 at +2 s: the same message again after "
        "its own failure) raised OperationalError: cannot start a transaction "
        "within a transaction"), bad


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
