"""The outbox, measured: save handlers and relays killed with SIGKILL, on real
SQLite / PostgreSQL and the course's Redis queue."""

import pytest
from db_targets import db_target, postgres_url  # noqa: F401 - fixtures

from handson import outbox, outbox_runs
from handson.effects.sqldb import Database

KILLS = 3


def _bench(target: str, redis_url: str) -> outbox_runs.Bench:
    """The worker's Redis is this test's alone while it runs: a job another
    test left there would reach the consumer as a document."""
    return outbox_runs.Bench(target, redis_url, own_redis=True)


@pytest.fixture
def bench(db_target, redis_url):  # noqa: F811 - the imported fixture
    b = _bench(db_target, redis_url)
    yield b
    b.close()


@pytest.fixture
def sqlite_bench(tmp_path, redis_url):
    """The two-step handlers never touch the database's transactions: SQLite
    alone shows them."""
    b = _bench(str(tmp_path / "app.sqlite"), redis_url)
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
    b = _bench(postgres_url, redis_url)
    try:
        run = outbox_runs.out_of_order_natural(b, loop)
    finally:
        b.close()
    expected = hidden_by_a_later_commit(run.commit_order) if loop == "high-water" \
        else 0
    assert expected > 0 or loop == "flag"
    assert run.skipped == expected


def test_sqlite_refuses_the_natural_interleaving(tmp_path, redis_url):
    b = _bench(str(tmp_path / "app.sqlite"), redis_url)
    try:
        with pytest.raises(ValueError, match="one transaction write at a time"):
            outbox_runs.out_of_order_natural(b, "flag")
    finally:
        b.close()


def test_killed_outbox_save_rolls_back_both_rows(tmp_path, redis_url):
    bench = _bench(str(tmp_path / "app.sqlite"), redis_url)
    try:
        bench.fresh().close()
        bench.process("save", ["--mode", "outbox", "--docs", "0", "3"], kill_at=1)
        with Database(bench.target) as db:
            assert outbox.documents(db) == {0}
            assert [d for (d,) in db.query("SELECT doc_id FROM outbox")] == [0]
    finally:
        bench.close()

