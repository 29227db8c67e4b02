"""The queue inside PostgreSQL and the relay that reads its log, on a real
server with real SIGKILLs: the contract's checks, the chaos engine with the
effect in the ack's transaction, the WAL relay killed between enqueue and
confirm (and, in the wrong order, between confirm and enqueue), the slot's
retained WAL, and the consumer's inbox."""

import psycopg
import pytest
from db_targets import postgres_url  # noqa: F401 - fixture

from handson import outbox, outbox_runs
from handson.faults.engine import ChaosConfig, run
from handson.queues.checks import run_checks

# The contract's quick checks. The others pass too but take 5-15 s each on a
# busy machine: `interleavings` and `killed_between_replies` stop a call
# between its Redis replies (this queue makes none), and the chaos runs below
# judge what `claim_atomic_concurrent`, `killed_attempt_counts`,
# `heartbeat_keeps_lease` and `attempt_grows` check (handed out twice,
# over-delivered, stale heartbeats).
CHECKS = ["enqueue_idempotent", "claim_returns_payload_and_attempt",
          "zombie_ack_refused", "zombie_extend_refused", "zombie_fail_refused",
          "owner_ack_after_zombie", "extend_does_not_resurrect",
          "reap_requeues_expired", "deadline_from_server_clock",
          "reap_atomic_concurrent", "poison_to_dlq_with_reason", "bound_refuses"]


@pytest.fixture(scope="module")
def pgq_url(postgres_url):  # noqa: F811 - the imported fixture
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PGQ_URL", postgres_url)
        yield postgres_url


def test_pg_queue_passes_the_contract_checks(pgq_url, redis_url):
    failed = [x.line() for x in run_checks("handson.queues.pgq", redis_url, CHECKS)
              if not x.ok]
    assert not failed, "\n".join(failed)


def test_enqueue_in_a_rolled_back_transaction_leaves_no_job(pgq_url):
    from handson.queues import pgq

    pgq.reset()
    with psycopg.connect(pgq_url, autocommit=True) as c:
        with c.transaction():
            pgq.enqueue_tx(c, {"doc_id": 1}, "kept")
        with c.transaction():
            pgq.enqueue_tx(c, {"doc_id": 2}, "dropped")
            raise psycopg.Rollback
    assert pgq.stats()["pending"] == 1
    assert pgq.claim(None, 5)[0] == "kept"


def test_dead_rows_pile_up_until_vacuum(pgq_url):
    from handson import pg_runs

    bl = pg_runs.backlog(jobs=2000, slice_=500)
    assert bl.dead_rows == sorted(bl.dead_rows) and bl.dead_after_vacuum == 0
    assert bl.dead_rows[0] < bl.dead_rows[-1]
    assert bl.claim_pages[0] < bl.claim_pages[-1]
    assert bl.pages_after_vacuum < bl.claim_pages[-1]


def test_commit_costs_come_from_servers_with_fsync_off_and_on(pgq_url, redis_url):
    """The chapter's cost comparison: the course's server (its own fsync
    setting, read back) beside a second one with fsync on, and the Redis
    queue beside one with appendfsync always; each row says what its server
    promised, read from the server."""
    from handson import pg_runs

    found = pg_runs.costs(redis_url, pgq_url, n=100)
    here = pg_runs.pg_settings(pgq_url)["fsync"]
    assert [(c.fsync, c.synchronous_commit) for c in found.commits] == [
        (here, "on"), (here, "off"), ("on", "on"), ("on", "off")]
    assert all(c.commits > 0 and c.median_ms > 0 for c in found.commits)
    assert [q.settings for q in found.queues][1:] == [
        "appendfsync always", f"fsync {here}, synchronous_commit on",
        "fsync on, synchronous_commit on", "fsync on, synchronous_commit off"]
    assert found.queues[3].acked_job_survives == "a crash of the machine"
    assert all(q.jobs_per_s > 0 for q in found.queues)
    assert pg_runs.pg_settings(pgq_url)["fsync"] == here   # left as it was


def test_the_cost_words_are_chosen_by_the_numbers():
    from handson import pg_runs

    assert pg_runs.faster("A", 300, "B", 100) == "the A was 3.0 times faster"
    assert pg_runs.faster("A", 100, "B", 250) == "the B was 2.5 times faster"
    assert "within 10%" in pg_runs.faster("A", 100, "B", 105)
    assert pg_runs.slower("x made it", 3.0, 1.0) == "x made it 3.0 times slower"
    assert pg_runs.slower("x made it", 1.0, 2.0) == "x made it 2.0 times faster"
    assert pg_runs.slower("x made it", 1.0, 1.05).endswith("(within 10%)")
    assert pg_runs.pg_durability("off", "on")[1] == (
        "a crash of the server, not of the machine")
    assert pg_runs.pg_durability("on", "off")[1].startswith("not a crash")
    assert pg_runs.redis_durability({"appendonly": "no", "save": ""})[1] == (
        "not even a restart of the server")
    assert pg_runs.redis_durability({})[0] == "unknown"


def test_claimers_at_repeatable_read_lose_the_race_with_40001(pgq_url):
    """The queue relies on READ COMMITTED: a claimer whose snapshot is older
    than a rival's claim takes the next job there, and is refused with
    SQLSTATE 40001 at REPEATABLE READ."""
    from handson import pg_runs

    rc, rr = (pg_runs.claim_race(level, jobs=200)
              for level in ("read committed", "repeatable read"))
    assert rc.claimed == rr.claimed == 200
    assert (rc.refused, rc.late_claimer) == (0, "late-1")
    assert rr.late_claimer == "SQLSTATE 40001"


def test_chaos_with_tx_effect_needs_a_queue_that_can_finish(redis_url):
    report = run(ChaosConfig(queue="handson.q", tx_effect=True), redis_url=redis_url)
    assert report.verdict == "unknown" and "finish()" in report.reason


def _chaos(tx: bool, redis_url: str):
    cfg = ChaosConfig(queue="handson.queues.pgq", docs=100, workers=3,
                      kill_every=0.6, min_kills=4, seed=1, idem=False, iters=2000,
                      lease_s=1.0, crash_points=("after-commit",), crash_p=0.1,
                      min_crash_kills=3, tx_effect=tx)
    return run(cfg, redis_url=redis_url)


def test_effect_in_the_acks_transaction_is_once_without_a_key(pgq_url, redis_url):
    """No dedup key (IDEM=0), workers SIGKILLed at random and right after their
    commit: the effect commits with the ack or not at all."""
    report = _chaos(True, redis_url)
    assert report.verdict == "valid", report.text()
    s = report.stats
    assert s["faults"]["crash_kills"]["after-commit"] >= 3
    assert s["kills"] >= 4 and s["lost"] == 0
    assert s["rows"] == s["distinct"] == s["counter"]
    # No commit whose job went out again or whose ack was refused. A kill
    # between finish() returning and the worker logging it leaves a commit
    # "unlogged": its ack is the same transaction, so it landed, and the job
    # was never handed out again (a random kill lands there now and then).
    assert s["unacked"]["died"] == s["unacked"]["refused"] == 0, s["unacked"]


def test_the_same_queue_with_the_ack_after_the_commit_applies_twice(pgq_url,
                                                                    redis_url):
    """The same run with the effect in another database and its own ack: each
    death after the commit is a second effect."""
    report = _chaos(False, redis_url)
    assert report.verdict == "invalid"
    assert report.invariants["applied_twice"].ok is False
    assert report.invariants["lost"].ok is True
    s = report.stats
    assert s["unacked"]["died"] >= 1
    assert s["rows"] == s["counter"] > s["distinct"]


def test_wal_relay_killed_before_confirming_duplicates_and_loses_nothing(
        pgq_url, redis_url):
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        run_ = outbox_runs.relay_kills(bench, False, docs=30, kills=3, loop="wal")
    finally:
        bench.close()
    assert run_.lost == 0
    assert run_.duplicate_deliveries == run_.duplicate_effects == 3


def test_wal_relay_confirming_before_the_enqueue_loses_a_job_per_kill(
        pgq_url, redis_url):
    """The wrong order, killed at the same points: each kill lands after the
    slot was told the transaction is done and before its job was enqueued, so
    the restarted relay never sees that row again."""
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        run_ = outbox_runs.relay_kills(bench, False, docs=30, kills=3,
                                       loop="wal-confirm-first")
    finally:
        bench.close()
    # every kill landed (run_or_kill raises otherwise), one transaction each
    assert run_.relay_kills == 3 and run_.lost == run_.relay_kills
    assert run_.deliveries == run_.documents - run_.lost
    assert run_.duplicate_deliveries == run_.duplicate_effects == 0


def test_wal_relay_confirms_only_what_its_peek_read(pgq_url, redis_url):
    """A commit written to the WAL but not yet flushed when the relay peeks,
    and flushed before it confirms. The old rule, confirming the write
    position (`pg_current_wal_lsn()`) after an empty peek, moves the slot past
    that commit, which the peek could not read: the row is never published.
    The relay confirms the flush position it read before its peek, and loses
    nothing. The gap is made, not waited for: the WAL writer is paused, the
    commit is asynchronous, and a bulk insert pushes it out of the WAL
    buffers, written but not flushed."""
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        try:
            old = outbox_runs.unflushed_commit(bench, outbox_runs.written)
        except outbox_runs.CannotPause as err:
            pytest.skip(f"the gap needs a server on this machine: {err}")
        new = outbox_runs.unflushed_commit(bench)
    finally:
        bench.close()
    for run_ in (old, new):     # the gap was open when the relay peeked
        assert run_.written_not_flushed_kib > 0 and run_.peeked == 0, run_
    assert (old.published, old.lost) == (1, 1), old
    assert (new.published, new.lost) == (2, 0), new


def test_wal_relay_publishes_rows_committed_out_of_id_order(pgq_url, redis_url):
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        run_ = outbox_runs.out_of_order_natural(bench, "wal")
    finally:
        bench.close()
    assert run_.commit_order != sorted(run_.commit_order)
    assert (run_.skipped, run_.published) == (0, run_.writers)


def test_unconfirmed_slot_retains_wal_until_the_relay_confirms(pgq_url,
                                                               redis_url):
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        ret = outbox_runs.slot_retention(bench, steps=(0, 100, 200))
    finally:
        bench.close()
    first, mid, last = ret.retained
    assert first < mid < last and last - mid > (mid - first) / 2   # grows with writes
    assert ret.published == 200
    assert ret.after_confirm < (last - first) / 10


def test_inbox_through_the_replay_matrix_cases(pgq_url, redis_url):
    bench = outbox_runs.Bench(pgq_url, redis_url, own_redis=True)
    try:
        cases = outbox_runs.inbox_cases(bench)
    finally:
        bench.close()
    # again, at once, killed inside: no effect; another message: one more
    assert [c.applied for c in cases] == [True, False, False, True, False, True]
    assert [c.effects for c in cases] == [1, 1, 2, 3, 3, 4]


def test_consumer_with_an_inbox_drains_a_queue_once_per_message(tmp_path,
                                                                redis_url):
    bench = outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url,
                              own_redis=True)
    db = bench.fresh()
    try:
        for message_id, doc_id in [(1, 5), (1, 5), (2, 5), (3, 6)]:
            bench.queue.enqueue(bench.r, {"doc_id": doc_id,
                                          "outbox_id": message_id})
        assert len(outbox.consume_all(db, bench.r, bench.queue, inbox=True)) == 4
        assert outbox.effects(db) == (3, 2)
    finally:
        db.close()
        bench.close()


def test_a_worker_hung_in_finish_keeps_its_job_until_the_server_ends_it(pgq_url):
    """The reaper skips the hung worker's locked row however long its lease
    has expired; idle_in_transaction_session_timeout on the worker's session
    ends the session, and the next reap takes the job back."""
    from handson import pg_runs

    stuck = pg_runs.hung_finish(None, watch_s=1.0)
    assert stuck.timeout == "0" and not stuck.job_back and stuck.skipped >= 1
    assert stuck.worker_ended.startswith("still open")
    freed = pg_runs.hung_finish(0.5)
    assert freed.timeout == "500ms" and freed.job_back
    assert 0.5 <= freed.watched_s < 3.0
    assert freed.worker_ended == "ended by the server (SQLSTATE 25P03)"


def test_the_one_counter_row_makes_finishing_workers_wait(pgq_url):
    """Every finish updates the same counter row, so concurrent ones wait on
    its lock; with a row per worker they do not, and every count is whole."""
    from handson import pg_runs

    one_row, per_worker, none = pg_runs.hot_counters(workers=4, jobs=300,
                                                     rounds=1)
    assert [c.total for c in (one_row, per_worker, none)] == [300] * 3
    assert one_row.lock_waits > per_worker.lock_waits
    assert all(c.jobs_per_s > 0 and c.samples > 0 for c in (one_row, per_worker))


def test_an_unconfirmed_slot_holds_its_catalog_xmin_and_wal(pgq_url):
    """pg_replication_slots as the chapter reads it: nothing confirmed, the
    slot's restart point and catalog_xmin stay while transactions go by;
    read, confirmed and checkpointed, both move on and the WAL is let go."""
    from handson import pg_runs

    made, unconfirmed, confirmed = pg_runs.slot_state(pgq_url, transactions=50)
    assert (unconfirmed.catalog_xmin, unconfirmed.restart_lsn) == (
        made.catalog_xmin, made.restart_lsn)
    assert unconfirmed.next_xid >= made.next_xid + 50
    assert unconfirmed.retained_kib > made.retained_kib > confirmed.retained_kib
    assert confirmed.catalog_xmin > made.catalog_xmin
    assert pg_runs.server_version(pgq_url) >= 130000   # max_slot_wal_keep_size
    with psycopg.connect(pgq_url) as c:     # the run dropped its slot
        assert not c.execute("SELECT 1 FROM pg_replication_slots WHERE "
                             "slot_name = 'eo_slot_state'").fetchone()
