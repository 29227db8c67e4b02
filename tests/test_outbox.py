"""The outbox, measured: save handlers and relays killed with SIGKILL, on real
SQLite / PostgreSQL and the course's Redis queue."""

from pathlib import Path

import pytest
from db_targets import db_target, postgres_url  # noqa: F401 - fixtures
from notebook_sources import mistake, solution_module

from autograder import outbox_relay as relay_grader
from autograder.grade import grade
from handson import outbox, outbox_runs
from handson.sqldb import Database

KILLS = 3


@pytest.fixture
def bench(db_target, redis_url):  # noqa: F811 - the imported fixture
    b = outbox_runs.Bench(db_target, redis_url)
    yield b
    b.close()


@pytest.fixture
def sqlite_bench(tmp_path, redis_url):
    """The two-step handlers never touch the database's transactions: SQLite
    alone shows them."""
    b = outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url)
    yield b
    b.close()


def test_commit_then_enqueue_leaves_documents_without_jobs(sqlite_bench):
    bench = sqlite_bench
    run = outbox_runs.dual_write(bench, "commit-then-enqueue", docs=40, kills=KILLS)
    assert run.documents == 40
    assert run.documents_without_job == KILLS
    assert run.jobs_without_document == 0


def test_enqueue_then_commit_leaves_jobs_without_documents(sqlite_bench):
    bench = sqlite_bench
    run = outbox_runs.dual_write(bench, "enqueue-then-commit", docs=40, kills=KILLS)
    assert run.jobs == 40
    assert run.jobs_without_document == KILLS
    assert run.documents_without_job == 0


def test_outbox_loses_nothing_when_the_handler_is_killed(bench):
    run = outbox_runs.dual_write(bench, "outbox", docs=40, kills=KILLS)
    # a save killed inside its transaction left neither row: nothing to lose
    assert run.documents == 40 - KILLS
    assert run.jobs == run.documents
    assert run.documents_without_job == 0
    assert run.jobs_without_document == 0


@pytest.mark.parametrize("keyed", [True, False])
def test_relay_killed_after_publish_duplicates_deliveries_not_effects(bench, keyed):
    run = outbox_runs.relay_kills(bench, keyed, docs=40, kills=KILLS)
    assert run.lost == 0
    assert run.duplicate_deliveries == KILLS
    assert run.duplicate_effects == (0 if keyed else KILLS)


def hidden_by_a_later_commit(commit_order: list[int]) -> int:
    """Ids that commit after a larger id was already visible to the relay."""
    return sum(1 for i, x in enumerate(commit_order) if x < max(commit_order[:i],
                                                                default=0))


def test_high_water_relay_skips_rows_committed_out_of_order(bench):
    run = outbox_runs.out_of_order(bench, "high-water")
    assert run.commit_order != sorted(run.commit_order)
    assert run.skipped == hidden_by_a_later_commit(run.commit_order) > 0
    assert run.published == run.writers - run.skipped


def test_sent_flag_relay_skips_nothing_under_the_same_commits(bench):
    run = outbox_runs.out_of_order(bench, "flag")
    assert run.commit_order != sorted(run.commit_order)
    assert (run.skipped, run.published) == (0, run.writers)


@pytest.mark.parametrize("loop", outbox.RELAY_LOOPS)
def test_postgres_commits_out_of_id_order_by_itself(postgres_url, redis_url, loop):  # noqa: F811
    """No ids taken by hand: open transactions take identity values in order."""
    b = outbox_runs.Bench(postgres_url, redis_url)
    try:
        run = outbox_runs.out_of_order_natural(b, loop)
    finally:
        b.close()
    expected = hidden_by_a_later_commit(run.commit_order) if loop == "high-water" \
        else 0
    assert expected > 0 or loop == "flag"
    assert run.skipped == expected


def test_sqlite_refuses_the_natural_interleaving(tmp_path, redis_url):
    b = outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url)
    try:
        with pytest.raises(ValueError, match="one transaction write at a time"):
            outbox_runs.out_of_order_natural(b, "flag")
    finally:
        b.close()


def test_killed_outbox_save_rolls_back_both_rows(tmp_path, redis_url):
    bench = outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url)
    try:
        bench.fresh().close()
        bench.process("save", ["--mode", "outbox", "--docs", "0", "3"], kill_at=1)
        with Database(bench.target) as db:
            assert outbox.documents(db) == {0}
            assert [d for (d,) in db.query("SELECT doc_id FROM outbox")] == [0]
    finally:
        bench.close()


# --- the graded assignment: outbox_relay ----------------------------------------

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = solution_module("outbox_relay", "myoutbox")
SELECT_UNSENT = (
    '    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"\n'
    '                    " LIMIT ?", (batch,))')
PUBLISH_THEN_MARK = '''    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))'''
MISTAKES = {
    "a relay that deletes before publishing": (
        PUBLISH_THEN_MARK, '''    for outbox_id, doc_id in rows:
        db.run("DELETE FROM outbox WHERE id = ?", (outbox_id,))
        pause("between", outbox_id)
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})''',
        {"relay_nothing_lost"}),
    "a relay that polls id > last": (
        SELECT_UNSENT + "\n" + PUBLISH_THEN_MARK,
        '''    (last,) = db.query("SELECT last_id FROM relay_state")[0]
    rows = db.query("SELECT id, doc_id FROM outbox WHERE id > ? ORDER BY id"
                    " LIMIT ?", (last, batch))
    for outbox_id, doc_id in rows:
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
        pause("between", outbox_id)
        db.run("UPDATE relay_state SET last_id = ?", (outbox_id,))''',
        {"no_skip_out_of_order"}),
    "a consumer without its key": (
        '''        if not db.query("INSERT INTO summarized (doc_id) VALUES (?)"
                        " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                        (doc_id,)):
            return False
''', "", {"effects_once", "relay_kills_effects_once"}),
    "a save in two transactions": (
        '''    with db.transaction():
        db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
        pause("between", doc_id)
        db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))''',
        '''    db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
    pause("between", doc_id)
    db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))''',
        {"save_atomic"}),
}


def test_solution_notebook_scores_full_marks():
    result = grade(ROOT / "solutions" / "outbox_relay")
    assert result.score == result.max_score, result.text()


def test_released_stub_scores_zero():
    result = grade(ROOT / "exercises" / "outbox_relay")
    assert result.score == 0, result.text()


@pytest.mark.parametrize("name", MISTAKES)
def test_each_common_mistake_loses_the_points_that_name_it(tmp_path, redis_url,
                                                           name):
    old, new, lost = MISTAKES[name]
    path = tmp_path / "myoutbox.py"
    path.write_text(mistake(SOLUTION, old, new))
    ev = relay_grader.evaluate_file(str(path), redis_url)
    assert {o.name for o in ev.outcomes if not o.ok} == lost, ev.problems
