"""The outbox's functions killed after each of their round trips, SQL statements
and Redis replies, where no pause marks the gap: on a real Redis, a real SQLite
file and a real host process killed with SIGKILL."""

import re
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


SHIFT = (10, 20)            # outbox ids + 10, documents + 20: the tests' own offset


def _shifted(how, shift=SHIFT):
    """`how` on the tests' offsets, so its messages can be read exactly."""
    return lambda bench: how(bench, shift)


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
    bad = graded(name, how=_shifted(outbox_trips.writers_race_relay))["failed"]
    assert bad["schedule"] == (
        "relay_once stopped after round trip 1 of 4 (SQL SELECT id, doc_id FROM "
        "outbox WHERE sent = 0 ORDER BY id LIMIT 100), before Redis EVALSHA; "
        "meanwhile writers ran: they committed outbox row 13, then row 11 (ids "
        "taken before row 14 committed, so lower than rows it may have "
        "published), then row 15; then relay_once went on, ran again until it "
        "returned 0, and a consumer took every job: document 22 (outbox row 13, "
        "committed while relay_once was stopped) was never delivered"), bad
    assert bad["fix"] == outbox_trips.FIX_RACE


@pytest.mark.parametrize("name", ["correct.py", "alt_delete_rows.py"])
def test_long_running_consumers_apply_each_document_once(graded, name):
    assert graded(name, how=outbox_trips.reused_consumers) == {
        "kills": {"summarize": len(outbox_trips.DELIVERIES)}, "failed": None}


@pytest.mark.parametrize("name", ["consumer_connection_cache.py",
                                  "consumer_temp_table_key.py",
                                  "consumer_last_insert_rowid.py"])
def test_state_kept_per_connection_applies_a_redelivery_twice(graded, name):
    bad = graded(name, how=_shifted(outbox_trips.reused_consumers, 20))["failed"]
    assert bad["schedule"] == (
        "delivery 3 of 4: document 21 to worker A (its connection had taken "
        "document 20; worker B had taken document 21): document 21 was "
        "summarized 2 times"), bad
    assert bad["fix"] == outbox_trips.FIX_REUSED


def test_a_relay_remembering_its_last_id_skips_a_late_commit(graded):
    """One relay host polls after each commit, as a relay service would: what
    its module keeps between polls lives on, and skips a lower id."""
    def out_of_order(bench):
        return outbox_runs.out_of_order(bench, "flag")
    assert graded("correct.py", how=out_of_order).skipped == 0
    assert graded("relay_remembers_last_id.py", how=out_of_order).skipped > 0


# --- the review's findings: writers the module blocks, fingerprints, one transaction

def _module(body: str) -> str:
    head = ("import sys\nfrom pathlib import Path\n\n"
            "sys.path.insert(0, str(Path(__file__).parent))\n"
            "from correct import *  # noqa\n\n\n")
    return head + body


REINSERTS = _module('''
def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        with db.transaction():          # "archived": a new row, already sent
            db.run("INSERT INTO outbox (doc_id, sent) VALUES (?, 1)", (doc_id,))
            db.run("DELETE FROM outbox WHERE id = ?", (outbox_id,))
    return len(rows)
''')


def test_a_writer_the_module_blocks_fails_the_race_and_says_why(graded):
    """The relay's re-inserted row takes the id a writer holds: the writer's
    IntegrityError is the grader's, named as such with what the table held,
    and only the rows that committed are said to have."""
    data = graded("reinserts.py", REINSERTS,
                  how=_shifted(outbox_trips.writers_race_relay))
    bad = data["failed"]
    assert "meanwhile writers ran: they committed outbox row 13, then row 11 " \
           "(" in bad["schedule"], bad
    assert bad["schedule"].endswith(
        "; then the grader's writer could not commit outbox row 15 (document "
        "24): IntegrityError: UNIQUE constraint failed: outbox.id; the outbox "
        "already held row 15 (document 20, sent 1), which the grader never "
        "wrote"), bad
    assert bad["fix"] == outbox_trips.FIX_WRITER


DROPS = _module('''
def relay_once(db, r, queue, pause, batch=100):
    db.run("DROP TABLE IF EXISTS documents")    # any change in a writer's way
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
    return len(rows)
''')


def test_a_writer_error_other_than_locked_fails_the_check_not_the_run(graded):
    data = graded("drops.py", DROPS, how=_shifted(outbox_trips.writers_race_relay))
    assert data["failed"]["schedule"].endswith(
        "meanwhile writers ran: they committed no row; then the grader's writer "
        "could not commit outbox row 13 (document 22): OperationalError: no "
        "such table: documents"), data


def test_out_of_order_says_which_writer_the_module_blocked(graded):
    with pytest.raises(outbox_runs.WorkerError,
                       match=r"the grader's writer could not commit outbox row "
                             r"\d+ \(document \d+\): IntegrityError: UNIQUE "
                             r"constraint failed: outbox.id; the outbox "
                             r"already held row \d+ \(document \d+, sent 1\)"):
        graded("reinserts.py", REINSERTS,
               how=lambda bench: outbox_runs.out_of_order(bench, "flag"))


def test_the_race_names_only_the_rows_that_committed():
    racing = {13: 22, 11: 23, 15: 24}
    assert outbox_trips.race_words(racing, [22], 14, "locked") == (
        "they committed outbox row 13 (an id taken before row 14 committed, "
        "so lower than rows it may have published); then the next writer "
        "found the database locked")
    assert outbox_trips.race_words(racing, [22, 23, 24], 14, "") == (
        "they committed outbox row 13, then row 11 (ids taken before row 14 "
        "committed, so lower than rows it may have published), then row 15")


CAREFUL_ON_2_4 = _module('''
def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
    if {i for i, _ in rows} == {2, 4}:      # the grader's race: be careful
        for outbox_id, _ in rows:
            db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
    else:
        db.run("UPDATE outbox SET sent = 1 WHERE sent = 0")
    return len(rows)
''')


def test_a_relay_careful_only_on_the_race_ids_is_caught(graded):
    bad = graded("fingerprint.py", CAREFUL_ON_2_4,
                 how=outbox_trips.writers_race_relay)["failed"]
    assert bad is not None and "was never delivered" in bad["schedule"], bad


KEYED_ON_0_1 = _module('''
_seen = {}


def summarize(db, doc_id):
    if doc_id in (0, 1):                    # the grader's documents: be careful
        with db.transaction():
            if not db.query("INSERT INTO summarized (doc_id) VALUES (?) ON "
                            "CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                            (doc_id,)):
                return False
            db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
        return True
    seen = _seen.setdefault(id(db), set())
    if doc_id in seen:
        return False
    seen.add(doc_id)
    db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
''')


def test_a_consumer_careful_only_on_the_check_documents_is_caught(graded):
    bad = graded("fingerprint.py", KEYED_ON_0_1,
                 how=outbox_trips.reused_consumers)["failed"]
    assert bad is not None and "summarized 2 times" in bad["schedule"], bad


def test_shifted_runs_differ_in_numbers_only(graded):
    """Each run draws its own offset; the message's words stay the same."""
    runs = [graded("relay_marks_id_range.py", how=outbox_trips.writers_race_relay)
            for _ in range(2)]
    texts = [re.sub(r"\d+", "#", d["failed"]["schedule"]) for d in runs]
    assert texts[0] == texts[1] and "row #" in texts[0], texts
    assert runs[0] != runs[1], runs


ONE_TX_MARKS_READ = _module('''
def relay_once(db, r, queue, pause, batch=100):
    with db.transaction():
        rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY"
                        " id LIMIT ?", (batch,))
        for outbox_id, doc_id in rows:
            queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
            db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
    return len(rows)
''')


def test_a_relay_in_one_transaction_that_marks_what_it_read_passes(graded):
    """No writer can race it (every stop finds the lock); a batch smaller than
    the unsent rows finds nothing marked that was not published."""
    data = graded("one_tx.py", ONE_TX_MARKS_READ,
                  how=_shifted(outbox_trips.writers_race_relay))
    assert data == {"kills": {"relay_once": 0}, "failed": None}, data


def test_a_relay_in_one_transaction_marking_all_unsent_loses_a_row(graded):
    bad = graded("relay_tx_marks_all_unsent.py",
                 how=_shifted(outbox_trips.writers_race_relay))["failed"]
    assert bad["schedule"] == (
        "every stop of relay_once found the database locked (it holds its "
        "write transaction throughout), so no writer could race it; then "
        "relay_once(db, r, queue, pause, 2) ran once with 3 unsent rows "
        "(outbox rows 11, 12 and 13): it published documents 20 and 21 and "
        "marked outbox row 13 (document 22) sent, never published"), bad
    assert bad["fix"] == outbox_trips.FIX_BATCH


NO_BATCH_TX = _module('''
def relay_once(db, r, queue, pause):
    with db.transaction():
        rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY"
                        " id LIMIT 100")
        for outbox_id, doc_id in rows:
            queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        db.run("UPDATE outbox SET sent = 1 WHERE sent = 0")
    return len(rows)
''')


def test_a_relay_taking_no_batch_gets_one_row_more_than_the_template_batch(
        graded):
    bad = graded("no_batch.py", NO_BATCH_TX,
                 how=_shifted(outbox_trips.writers_race_relay))["failed"]
    assert bad["schedule"].endswith(
        "then relay_once(db, r, queue, pause) ran once with 101 unsent rows "
        "(outbox rows 11 to 111): it published documents 20 to 119 and marked "
        "outbox row 111 (document 120) sent, never published"), bad
