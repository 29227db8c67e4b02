"""The outbox's functions killed after each of their round trips, SQL statements
and Redis replies, where no pause marks the gap: on a real Redis, a real SQLite
file and a real host process killed with SIGKILL."""

import shutil

import pytest

from autograder.judges import corpus, outbox_relay
from handson import outbox_runs, outbox_trips

FOLDER = corpus.ROOT / "outbox"


@pytest.fixture
def graded(tmp_path, r, redis_url):
    """Kill between round trips (or `how`), on a copy of one corpus module
    (beside the correct one it star-imports), or on `source`: the run's data."""
    def run(name: str, source: str | None = None,
            how=outbox_trips.killed_between_trips) -> dict:
        shutil.copy(FOLDER / corpus.BASE, tmp_path / corpus.BASE)
        if source is None:
            shutil.copy(FOLDER / name, tmp_path / name)
        else:
            (tmp_path / name).write_text(source)
        bench = outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url,
                                  module=str(tmp_path / name), own_redis=True)
        try:
            return how(bench)
        finally:
            bench.close()
    return run


@pytest.mark.parametrize("name", ["correct.py", "alt_delete_rows.py"])
def test_a_correct_outbox_survives_every_kill_between_round_trips(graded, name):
    """A transaction shows nothing until its COMMIT, its last round trip: no
    kill of save or consumer leaves a state of its own. The relay leaves one
    after each publish and each mark but the last (one per round trip after
    its SELECT, DOCS rows)."""
    data = graded(name)
    assert data == {"kills": {"save_document": 0, "summarize": 0,
                              "relay_once": 2 * outbox_trips.DOCS - 1},
                    "failed": None}, data


@pytest.mark.parametrize("name, fn, k, words", [
    ("relay_marks_then_publishes.py", "relay_once", 2,
     ["(SQL UPDATE outbox SET sent = 1 WHERE id = 1), before Redis EVALSHA",
      "document 0 was never delivered"]),
    ("summarize_two_statements.py", "summarize", 1,
     ["before SQL INSERT INTO summaries", "summarized 0 times"]),
    ("save_no_transaction.py", "save_document", 1,
     ["before SQL INSERT INTO outbox", "document 0 is saved but no job came"]),
])
def test_a_gap_no_pause_marks_is_found_and_named(graded, name, fn, k, words):
    data = graded(name)
    bad = data["failed"]
    assert bad["function"] == fn and bad["round_trip"] == k, data
    assert bad["schedule"].startswith(f"{fn} killed (SIGKILL) after round trip "
                                      f"{k} of "), bad
    assert all(w in bad["schedule"] for w in words), bad
    assert bad["fix"] == outbox_trips.FIX[fn]


def test_the_same_module_gets_the_same_verdict(graded):
    assert graded("relay_marks_then_publishes.py") == graded(
        "relay_marks_then_publishes.py")


HIDING = '''
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # noqa


def relay_once(db, r, queue, pause, batch=100):
    db._conn.set_trace_callback(None)       # the host counts no statement
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0")
    for outbox_id, doc_id in rows:
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
    return len(rows)
'''


def test_a_relay_that_hides_its_statements_gets_no_pass(graded):
    """Unsetting the trace callback would hide the mark before the publish:
    the database changed with no statement counted, and the run says so."""
    data = graded("hiding.py", HIDING)
    assert data == {"error": "relay_once changed the database, yet its host "
                    "counted no SQL round trip: use the db and r you are given, "
                    "as they are, so the grader can kill your code between any "
                    "two of its steps"}, data


def _judged(round_trips: dict | None) -> outbox_relay.Outcome:
    obs = {} if round_trips is None else {"round_trips": round_trips}
    obs.setdefault("error", "the outbox run ended with exit code 1")
    return outbox_relay._round_trips(
        obs, next(c for c in outbox_relay.CHECKS
                  if c.name == "killed_between_round_trips"))


def test_the_grade_says_where_it_was_killed_and_what_to_change():
    bad = {"function": "relay_once", "round_trip": 2, "schedule": "relay_once "
           "killed (SIGKILL) after round trip 2 of 5", "fix": "publish first"}
    out = _judged({"kills": {"save_document": 0, "relay_once": 2}, "failed": bad})
    assert not out.ok and out.message == "publish first"
    assert out.got == bad["schedule"] and out.max_points == 2
    ok = _judged({"kills": {"save_document": 1, "relay_once": 3, "summarize": 0},
                  "failed": None})
    assert ok.ok and ok.got.startswith("4 kills between round trips")
    none = _judged({"kills": {"summarize": 0}, "failed": None})
    assert none.ok and none.got.startswith("no round trip left a gap")
    assert not _judged(None).ok and "exit code 1" in _judged(None).message


@pytest.mark.parametrize("name", ["correct.py", "alt_delete_rows.py"])
def test_a_consumer_in_one_transaction_leaves_no_gap_to_a_rival(graded, name):
    """Stopped anywhere, it holds the write lock (BEGIN IMMEDIATE first): the
    rival finds the database locked, so no stop counts."""
    assert graded(name, how=outbox_trips.interleaved_consumers) == {
        "kills": {"summarize": 0}, "failed": None}


def test_a_consumer_that_looks_then_writes_applies_the_effect_twice(graded):
    """Killed anywhere it holds (the kills pass it); a rival in its gap
    does not."""
    name = "consumer_checks_then_writes.py"
    assert graded(name)["failed"] is None
    bad = graded(name, how=outbox_trips.interleaved_consumers)["failed"]
    assert bad["schedule"] == (
        "summarize stopped after round trip 1 of 5 (SQL SELECT 1 FROM summarized "
        "WHERE doc_id = 0), before SQL BEGIN IMMEDIATE; meanwhile another "
        "consumer ran summarize(db, 0) to its end; then the first went on: "
        "document 0 was summarized 2 times"), bad
    assert bad["fix"] == outbox_trips.FIX_RIVAL


@pytest.mark.parametrize("name", ["correct.py", "alt_mark_ids_in.py",
                                  "alt_delete_rows.py"])
def test_a_relay_that_marks_what_it_read_keeps_every_racing_row(graded, name):
    """Writers commit while the relay is stopped after any round trip: a relay
    that marks (or deletes) exactly the ids it read leaves theirs unsent."""
    data = graded(name, how=outbox_trips.writers_race_relay)
    assert data["failed"] is None and data["kills"]["relay_once"] >= 3, data


@pytest.mark.parametrize("name", ["relay_marks_id_range.py",
                                  "relay_marks_all_unsent.py"])
def test_a_relay_that_marks_rows_it_never_read_loses_a_racing_one(graded, name):
    bad = graded(name, how=outbox_trips.writers_race_relay)["failed"]
    assert bad["schedule"].startswith(
        "relay_once stopped after round trip 1 of 4 (SQL SELECT id, doc_id FROM "
        "outbox WHERE sent = 0 ORDER BY id LIMIT 100), before Redis EVALSHA; "
        "meanwhile writers committed outbox row 3, then row 1"), bad
    assert bad["schedule"].endswith(
        "document 2 (outbox row 3, committed while relay_once was stopped) was "
        "never delivered"), bad
    assert bad["fix"] == outbox_trips.FIX_RACE


@pytest.mark.parametrize("name", ["correct.py", "alt_delete_rows.py"])
def test_long_running_consumers_apply_each_document_once(graded, name):
    assert graded(name, how=outbox_trips.reused_consumers) == {
        "kills": {"summarize": len(outbox_trips.DELIVERIES)}, "failed": None}


@pytest.mark.parametrize("name", ["consumer_connection_cache.py",
                                  "consumer_temp_table_key.py",
                                  "consumer_last_insert_rowid.py"])
def test_state_kept_per_connection_applies_a_redelivery_twice(graded, name):
    bad = graded(name, how=outbox_trips.reused_consumers)["failed"]
    assert bad["schedule"] == (
        "delivery 3 of 4: document 1 to worker A (its connection had taken "
        "document 0; worker B had taken document 1): document 1 was summarized "
        "2 times"), bad
    assert bad["fix"] == outbox_trips.FIX_REUSED


def test_a_relay_remembering_its_last_id_skips_a_late_commit(graded):
    """One relay host polls after each commit, as a relay service would: what
    its module keeps between polls lives on, and skips a lower id."""
    def out_of_order(bench):
        return outbox_runs.out_of_order(bench, "flag")
    assert graded("correct.py", how=out_of_order).skipped == 0
    assert graded("relay_remembers_last_id.py", how=out_of_order).skipped > 0
