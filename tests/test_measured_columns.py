"""Every measured column or verdict in the chapters can fail: break the behaviour.

Each chapter checks what its prose says about a table with a function from
handson (`check_*`). Here each of those tables is produced again, small, from a
system with the behaviour broken (a queue that acks in its claim, XACK before
instead of after, random partitions, a blind lookup, a two-step save, a relay
that deletes before it publishes, commits in id order), and the chapter's
check must raise: the column is the system's doing, not the page's.
"""

from pathlib import Path

import pytest

from handson import measure, outbox, outbox_runs, replay_matrix
from handson.queues import streams_log

CORPUS = Path(__file__).parent / "corpus" / "queues"
KILLS = 2


@pytest.fixture(autouse=True)
def _empty(r):
    """Start from an empty server: the session's is shared with the other test
    files this process runs, and a bench drains whatever queue it finds."""


# -- the lab: the Measure table ----------------------------------------------------

def test_measure_chaos_check_fails_when_the_claim_acks(redis_url):
    # ack_in_claim forgets a job as it hands it out; a worker that dies right
    # after its claim loses the job, and the table's `lost` column shows it.
    # (tests/test_measure.py runs the same table on the reference queue.)
    rows = measure.chaos("small", url=redis_url, seed=3,
                         queue=str(CORPUS / "ack_in_claim.py"), docs=20,
                         iters=1000, kill_every=0, crash_points=("after-claim",),
                         crash_p=0.15, lease_s=0.5)
    assert any(x.lost for x in rows), rows
    assert any(x.verdict == "invalid" for x in rows), rows
    with pytest.raises(AssertionError, match="nothing is lost"):
        measure.check_chaos(rows)


# -- Queues and logs: the commit demo and partition ordering ------------------------

def test_commit_check_fails_when_the_commit_moves(redis_url):
    # The "after" row measured from a consumer that XACKs before its work, and
    # the "before" row from one that XACKs after: the check refuses both.
    before = streams_log.commit_demo(redis_url, "before")
    after = streams_log.commit_demo(redis_url, "after")
    streams_log.check_commits(before, after)
    assert before["replayed"] == 0 < before["skipped"]
    with pytest.raises(AssertionError, match="must replay, not skip"):
        streams_log.check_commits(before, before)
    with pytest.raises(AssertionError, match="must skip, not replay"):
        streams_log.check_commits(after, after)


def test_order_check_fails_when_the_key_picks_a_random_partition(redis_url,
                                                                monkeypatch):
    import random

    rnd = random.Random(5)
    monkeypatch.setattr(streams_log, "partition_for",
                        lambda key, partitions: rnd.randrange(partitions))
    keyed = streams_log.order_demo(redis_url, keyed=True)
    assert keyed["partitions_per_doc"] > 1 and keyed["late_per_key"] > 0
    spread = streams_log.order_demo(redis_url, keyed=False)
    with pytest.raises(AssertionError, match="keyed must keep"):
        streams_log.check_order(keyed, spread)


# -- the replay matrix: the policy table -------------------------------------------

BLIND_LOOKUP = '''"""The lookup policy, with a lookup that never finds the email."""
from handson import confirmation_job


class Blind:
    def __init__(self, mailer):
        self._mailer = mailer

    def __getattr__(self, name):
        return getattr(self._mailer, name)

    def lookup(self, reference):
        return False


def send_confirmation(db, mailer, key, now, lease_s, pause):
    return confirmation_job.send_confirmation(db, Blind(mailer), key, now,
                                              "lookup", lease_s, pause)
'''


def test_policy_check_fails_when_the_lookup_finds_nothing(tmp_path):
    job = tmp_path / "blind_lookup.py"
    job.write_text(BLIND_LOOKUP)
    target = str(tmp_path / "jobs.sqlite")
    blind = replay_matrix.Lab(target, str(tmp_path), "lookup", job=str(job))
    five, six = replay_matrix.policy_emails(blind)
    assert six == 2, (five, six)         # died after sending: sent again
    with pytest.raises(AssertionError, match="exactly one email"):
        replay_matrix.check_policies([("lookup", five, six)])
    honest = replay_matrix.Lab(target, str(tmp_path), "lookup")
    replay_matrix.check_policies([("lookup", *replay_matrix.policy_emails(honest))])


# -- the outbox: the save and relay counts ------------------------------------------

LEARNER = '''"""Save, relay and summarize as the outbox chapter's, one step broken."""
from handson import outbox


def save_document(db, doc_id, body, pause):
    {save}


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 "
                    "ORDER BY id LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        {relay}
    return len(rows)


def summarize(db, doc_id):
    return outbox.summarize(db, doc_id)
'''
SAVE_OK = ("outbox.save_with_id(db, outbox.next_outbox_id(db), doc_id, body)\n"
           "    pause('between', doc_id)")
SAVE_TWO_STEPS = (
    "db.run('INSERT INTO documents (id, body) VALUES (?, ?)', (doc_id, body))\n"
    "    pause('between', doc_id)\n"
    "    db.run('INSERT INTO outbox (doc_id) VALUES (?)', (doc_id,))")
RELAY_OK = ("queue.enqueue(r, {'doc_id': doc_id, 'outbox_id': outbox_id})\n"
            "        pause('between', outbox_id)\n"
            "        db.run('UPDATE outbox SET sent = 1 WHERE id = ?', (outbox_id,))")
RELAY_DELETES_FIRST = (
    "db.run('DELETE FROM outbox WHERE id = ?', (outbox_id,))\n"
    "        pause('between', outbox_id)\n"
    "        queue.enqueue(r, {'doc_id': doc_id, 'outbox_id': outbox_id})")


def _bench(tmp_path, redis_url, save: str, relay: str) -> outbox_runs.Bench:
    module = tmp_path / "myoutbox.py"
    module.write_text(LEARNER.format(save=save, relay=relay))
    return outbox_runs.Bench(str(tmp_path / "app.sqlite"), redis_url,
                             module=str(module))


def _reference_saves(tmp_path, redis_url, docs):
    ref = outbox_runs.Bench(str(tmp_path / "ref.sqlite"), redis_url)
    try:
        return [outbox_runs.dual_write(ref, m, docs=docs, kills=KILLS)
                for m in outbox.SAVE_MODES[:2]]
    finally:
        ref.close()


def test_save_check_fails_when_the_outbox_row_is_a_second_step(tmp_path, redis_url):
    saves = _reference_saves(tmp_path, redis_url, docs=20)
    bench = _bench(tmp_path, redis_url, SAVE_TWO_STEPS, RELAY_OK)
    try:
        box = outbox_runs.dual_write(bench, "outbox", docs=20, kills=KILLS)
    finally:
        bench.close()
    assert box.documents_without_job == KILLS, box
    with pytest.raises(AssertionError, match="keep documents and jobs together"):
        outbox_runs.check_saves([*saves, box], KILLS)


def test_relay_check_fails_when_the_relay_deletes_before_it_publishes(tmp_path,
                                                                     redis_url):
    bench = _bench(tmp_path, redis_url, SAVE_OK, RELAY_DELETES_FIRST)
    try:
        keyed = outbox_runs.relay_kills(bench, True, docs=20, kills=KILLS)
    finally:
        bench.close()
    assert keyed.lost == KILLS and keyed.duplicate_deliveries == 0, keyed
    with pytest.raises(AssertionError):
        outbox_runs.check_relays([keyed, keyed], KILLS)
    honest = _bench(tmp_path, redis_url, SAVE_OK, RELAY_OK)
    ref = outbox_runs.Bench(str(tmp_path / "ref.sqlite"), redis_url)
    try:
        good = outbox_runs.relay_kills(honest, True, docs=20, kills=KILLS)
        # this module's consumer keeps its key either way: the "without a key"
        # run of a sink that dedups perfectly
        perfect = outbox_runs.relay_kills(honest, False, docs=20, kills=KILLS)
        naive = outbox_runs.relay_kills(ref, False, docs=20, kills=KILLS)
    finally:
        honest.close()
        ref.close()
    outbox_runs.check_relays([naive, good], KILLS)
    assert perfect.duplicate_effects == 0, perfect
    with pytest.raises(AssertionError, match="without the key"):
        outbox_runs.check_relays([perfect, good], KILLS)


class _IdOrder:
    """A shuffle that keeps every list as it is: writers commit in id order."""

    def __init__(self, seed):
        pass

    def shuffle(self, xs):
        pass


def test_order_check_fails_when_commits_follow_the_ids(tmp_path, redis_url,
                                                       monkeypatch):
    bench = outbox_runs.Bench(str(tmp_path / "order.sqlite"), redis_url)
    try:
        shuffled = [outbox_runs.out_of_order(bench, lp) for lp in outbox.RELAY_LOOPS]
        outbox_runs.check_orders(shuffled)
        monkeypatch.setattr(outbox_runs.random, "Random", _IdOrder)
        in_order = [outbox_runs.out_of_order(bench, lp) for lp in outbox.RELAY_LOOPS]
    finally:
        bench.close()
    assert all(o.commit_order == sorted(o.commit_order) for o in in_order), in_order
    assert [o.skipped for o in in_order] == [0, 0], in_order
    with pytest.raises(AssertionError, match="must skip a row committed below"):
        outbox_runs.check_orders(in_order)


# -- the lab: reading a chaos report ------------------------------------------------

def test_chaos_report_verdict_is_the_bug_not_the_configuration(redis_url):
    # The lab's report run (named after-claim crashes), smaller: the queue whose
    # claim acks comes out invalid with lost jobs, the reference queue valid.
    from handson.faults.engine import ChaosConfig
    from handson.faults.engine import run as chaos_run

    config = dict(docs=40, workers=2, iters=5000, lease_s=0.5, kill_every=0,
                  crash_points=("after-claim",), crash_p=0.1, seed=3)
    broken = chaos_run(ChaosConfig(queue=str(CORPUS / "ack_in_claim.py"),
                                   **config), redis_url=redis_url)
    assert broken.verdict == "invalid" and broken.invariants["lost"].count > 0
    fixed = chaos_run(ChaosConfig(**config), redis_url=redis_url)
    assert fixed.verdict == "valid" and fixed.invariants["lost"].count == 0
    assert fixed.stats["crash_kills"] > 0          # the same crashes happened
