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


@pytest.mark.parametrize("name, stops", [("correct.py", 0),
                                         ("points_lookup_then_claim.py", 1)])
def test_two_deliveries_at_once_add_one_ledger_row(tmp_path, name, stops):
    """The claim first, in the transaction: every stop holds the lock, so the
    rival only waits. A lookup before the claim: the rival, run in its gap,
    adds the row and the stopped call adds it again."""
    for f in {name, corpus.BASE}:
        shutil.copy(FOLDER / f, tmp_path / f)
    data = claims_trips.interleaved_points(
        str(tmp_path / "jobs.sqlite"), str(tmp_path / name), replay_matrix.KEY,
        replay_matrix.T0)
    assert data["kills"] == {"award_points": stops}, data
    if stops:
        assert data["failed"]["schedule"].endswith(
            "then the first went on: 2 ledger row(s), record ['completed']"), data
    else:
        assert data["failed"] is None


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
