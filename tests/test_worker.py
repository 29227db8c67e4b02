"""The lab's worker as a real process on a real Redis: sink, heartbeat, crash points."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from handson import produce, q, redis_server, setup_db, sink, verify


def test_idempotent_sink_applies_once_and_counts_once(tmp_path):
    db = setup_db.connect(setup_db.setup(tmp_path / "r.db"))
    assert sink.apply(db, "doc-1", 1, 0.5, 1, idem=True) is True
    assert sink.apply(db, "doc-1", 1, 0.5, 2, idem=True) is False
    assert verify.summary(db) == {"rows": 1, "naive_rows": 0, "naive_distinct": 0,
                                  "counter": 1}
    assert db.execute("select job_id, attempt from applied").fetchall() == [
        ("doc-1", 1)]


OPEN_NEW_FILE = """
import sys, time
from handson import setup_db
t = float(sys.argv[2])
time.sleep(max(0, t - time.time()))
setup_db.connect(sys.argv[1], timeout=10).execute("select 1")
"""


class _LateEvent(threading.Event):
    """A heartbeat thread that wakes LATE_S after its beat was due: what a
    worker resumed from a pause is, when its job's thread runs first."""
    LATE_S = 0.2

    def wait(self, timeout=None):
        time.sleep((timeout or 0) + self.LATE_S)
        return self.is_set()


class _Beats:
    """The little of a worker a heartbeat uses; counts its extends."""

    def __init__(self):
        self.lease_s, self.r, self.extends = 1.0, None, []
        self.q = SimpleNamespace(extend=lambda r, job, attempt, lease:
                                 self.extends.append((job, attempt)) or True)
        self.crashes = SimpleNamespace(inside=lambda name, fn, *a: fn(*a),
                                       maybe=lambda *a, **k: None)
        self.events = SimpleNamespace(log=lambda *a, **k: None)


@pytest.mark.parametrize("lease_s, stop_after_s, beats", [(1.5, 0.0, 0),
                                                           (0.3, 0.25, 1)])
def test_a_heartbeat_due_before_its_stop_still_goes_out(lease_s, stop_after_s,
                                                         beats):
    """Stopped before its first beat (due at lease/3): none. Stopped 150 ms
    after it was due, while its thread still slept: the overdue beat goes out,
    as a paused zombie's must, however its threads are scheduled."""
    from handson.worker import Heartbeat

    w = _Beats()
    w.lease_s = lease_s
    hb = Heartbeat(w, "doc-1", 2)
    hb.stopped = _LateEvent()
    hb.start()
    time.sleep(stop_after_s)
    hb.stop()
    if beats:       # a late test thread may let a second one out: not the point
        assert w.extends[:1] == [("doc-1", 2)]
    else:
        assert w.extends == []


def test_processes_opening_a_new_file_at_once_all_get_it(tmp_path):
    """Switching a new file to WAL from two processes at once can be refused as
    "locked" without the busy wait; two workers start together in the replay lab."""
    failures = []
    for trial in range(25):
        path, start = tmp_path / f"new{trial}.sqlite", time.time() + 0.3
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_NEW_FILE, str(path),
                                   str(start)], stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=60)
            if p.returncode:
                failures.append(err.strip().splitlines()[-1])
    assert failures == []


def test_naive_sink_applies_every_delivery(tmp_path):
    db = setup_db.connect(setup_db.setup(tmp_path / "r.db"))
    for attempt in (1, 2):
        assert sink.apply(db, "doc-1", 1, 0.5, attempt, idem=False) is True
    assert verify.summary(db) == {"rows": 0, "naive_rows": 2, "naive_distinct": 1,
                                  "counter": 2}
    assert db.execute("select count(*) from applied").fetchone()[0] == 2


def test_results_db_is_wal(tmp_path):
    db = setup_db.connect(setup_db.setup(tmp_path / "r.db"))
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_read_that_lost_the_wal_race_is_tried_again(tmp_path):
    """SQLITE_PROTOCOL beside writers killed on a loaded machine once failed a
    chaos run's progress read; it passes, and any other error does not."""
    db = setup_db.connect(setup_db.setup(tmp_path / "r.db"))
    told = []

    def read():
        if len(told) < 2:
            told.append(1)
            raise sqlite3.OperationalError("locking protocol")
        return db.execute("select n from stats").fetchone()[0]

    assert setup_db.retrying(read) == 0 and len(told) == 2

    def broken():
        told.append(1)
        raise sqlite3.OperationalError("no such table: nowhere")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        setup_db.retrying(broken)
    assert len(told) == 3

    def always():
        raise sqlite3.OperationalError("locking protocol")

    with pytest.raises(sqlite3.OperationalError, match="locking protocol"):
        setup_db.retrying(always, timeout=0.05)


class Worker:
    """One `python -m handson.worker` process with its own events directory."""

    def __init__(self, url, tmp_path: Path, *args, **env):
        self.events = tmp_path / "events"
        self.events.mkdir(exist_ok=True)
        self.db = tmp_path / "results.db"
        if not self.db.exists():
            setup_db.setup(self.db)
        self.log = tmp_path / "worker.log"
        full_env = dict(os.environ, REDIS_URL=url, ITERS="2000")
        full_env.update({k: str(v) for k, v in env.items()})
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "handson.worker", "--queue", "handson.q",
                 "--db", str(self.db), "--events", str(self.events), *args],
                env=full_env, stdout=log, stderr=log, start_new_session=True)

    def read(self) -> list[dict]:
        path = self.events / f"{self.proc.pid}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def wait_for(self, pred, timeout=30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.read()
            if pred(events):
                return events
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"condition not met; rc={self.proc.poll()}, events "
                             f"{self.read()[-5:]}, log {self.log.read_text()[-800:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=10)


@pytest.fixture
def workers():
    started = []
    yield started
    for w in started:
        w.stop()


def _kinds(events, job=None):
    return [e["ev"] for e in events if job is None or e.get("job") == job]


def test_worker_drains_buries_poison_with_reason_and_stops_on_sigterm(
        r, redis_url, tmp_path, workers):
    ids = produce.produce(r, q, 20, poison_every=10)        # doc-7, doc-17 poison
    w = Worker(redis_url, tmp_path, "--max-attempts", "2")
    workers.append(w)
    w.wait_for(lambda ev: len(q.dead(r)) == 2 and "idle" in _kinds(ev))
    assert verify.summary(str(w.db))["rows"] == 18
    assert sorted(d[0] for d in q.dead(r)) == ["doc-17", "doc-7"]
    assert all("cannot tokenize" in d[2] and d[1] == 2 for d in q.dead(r))
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(timeout=10) == 0
    events = w.read()
    assert events[-1]["ev"] == "stop"
    acked = {e["job"] for e in events if e["ev"] == "ack"}
    assert acked == set(ids) - {"doc-7", "doc-17"}
    assert [e["ok"] for e in events if e["ev"] == "fail"] == [True] * 4


def test_heartbeat_keeps_a_long_job_past_its_lease(r, redis_url, tmp_path, workers):
    q.enqueue(r, {"doc_id": 1, "text": "long"}, "doc-1")
    # A lease of 0.6 s (a beat may be 0.4 s late): in a loaded suite a 0.3 s
    # one ran out on a correct worker.
    w = Worker(redis_url, tmp_path, "--lease", "0.6", ITERS=3_000_000)
    workers.append(w)
    w.wait_for(lambda ev: "claim" in _kinds(ev))
    while w.proc.poll() is None and "ack" not in _kinds(w.read()):
        assert q.reap(r, 3) == (0, 0)        # never expired while heartbeating
        time.sleep(0.05)
    events = w.read()
    assert _kinds(events, "doc-1").count("extend") >= 2
    assert _kinds(events, "doc-1")[-1] == "ack"


def test_worker_abandons_a_job_whose_lease_was_taken(r, redis_url, tmp_path,
                                                      workers):
    q.enqueue(r, {"doc_id": 1, "text": "long"}, "doc-1")
    w = Worker(redis_url, tmp_path, "--lease", "0.3", ITERS=2_000_000)
    workers.append(w)
    w.wait_for(lambda ev: "claim" in _kinds(ev))
    os.killpg(w.proc.pid, signal.SIGSTOP)           # a long GC pause
    time.sleep(0.6)
    assert q.reap(r, 3) == (1, 0)
    job_id, _, attempt = q.claim(r, 30)             # the new owner
    assert (job_id, attempt) == ("doc-1", 2)
    os.killpg(w.proc.pid, signal.SIGCONT)
    events = w.wait_for(lambda ev: "abandoned" in _kinds(ev))
    assert _kinds(events, "doc-1")[-2:] == ["extend_refused", "abandoned"]
    assert verify.summary(str(w.db))["rows"] == 0   # no commit
    assert q.ack(r, "doc-1", 2)                     # and the owner's ack stands
    assert "abandoned" in w.log.read_text()


def test_ack_before_work_acks_before_the_commit(r, redis_url, tmp_path, workers):
    produce.produce(r, q, 3)
    w = Worker(redis_url, tmp_path, "--ack-before-work")
    workers.append(w)
    events = w.wait_for(lambda ev: _kinds(ev).count("commit") == 3)
    for job in ("doc-0", "doc-1", "doc-2"):
        assert _kinds(events, job) == ["claim", "ack", "commit"]


def test_after_commit_crash_point_kills_between_commit_and_ack(
        r, redis_url, tmp_path, workers):
    produce.produce(r, q, 1)
    w = Worker(redis_url, tmp_path, CRASH_POINT="after-commit", CRASH_P=1)
    workers.append(w)
    assert w.proc.wait(timeout=30) == -signal.SIGKILL
    assert _kinds(w.read(), "doc-0") == ["claim", "commit", "crash_point"]
    assert verify.summary(str(w.db))["rows"] == 1
    assert q.stats(r)["inflight"] == 1               # applied, never acked


def test_during_heartbeat_crash_point_dies_right_after_an_extend(
        r, redis_url, tmp_path, workers):
    q.enqueue(r, {"doc_id": 1, "text": "long"}, "doc-1")
    w = Worker(redis_url, tmp_path, "--lease", "0.3", ITERS=3_000_000,
               CRASH_POINT="during-heartbeat", CRASH_P=1)
    workers.append(w)
    assert w.proc.wait(timeout=30) == -signal.SIGKILL
    assert _kinds(w.read(), "doc-1") == ["claim", "extend", "crash_point"]


def test_mid_call_crash_point_fires_inside_a_contract_call(r, redis_url, tmp_path,
                                                           workers):
    w = Worker(redis_url, tmp_path, CRASH_POINT="mid-call", CRASH_P=1)
    workers.append(w)
    assert w.proc.wait(timeout=30) == -signal.SIGKILL
    crash = [e for e in w.read() if e["ev"] == "crash_point"]
    assert crash and crash[0]["call"] == "reap"


def test_mid_claim_crash_point_fires_only_inside_claim(r, redis_url, tmp_path,
                                                      workers):
    q.enqueue(r, {"doc_id": 1, "text": "short"}, "doc-1")
    w = Worker(redis_url, tmp_path, CRASH_POINT="mid-claim", CRASH_P=1)
    workers.append(w)
    assert w.proc.wait(timeout=30) == -signal.SIGKILL
    events = w.read()
    crash = [e for e in events if e["ev"] == "crash_point"]
    assert [(e["point"], e["call"]) for e in crash] == [("mid-claim", "claim")]
    assert not [e for e in events if e["ev"] == "claim"]     # died inside it


CORPUS = Path(__file__).parent / "corpus" / "queues"


@pytest.mark.parametrize("hosted", [False, True], ids=["local", "hosted"])
def test_mid_reap_kills_only_between_a_reaps_round_trips(r, redis_url, tmp_path,
                                                          workers, hosted):
    """A reap in one script has no gap (the worker lives and acks); a reap that
    takes the expired lease in one script and requeues in later ones dies
    between them, in its own process or in the host of a learner's queue (the
    host's first call also makes its connection: that handshake is no gap)."""
    from handson.queues.contract import load_queue

    env = {"EO_LEARNER_PREFIX": "[]"} if hosted else {}
    q.enqueue(r, {"doc_id": 1, "text": "short"}, "doc-1")
    w = Worker(redis_url, tmp_path, CRASH_POINT="mid-reap", CRASH_P=1, **env)
    workers.append(w)
    w.wait_for(lambda ev: "ack" in _kinds(ev, "doc-1"), timeout=60)
    assert [e for e in w.read() if e["ev"] == "crash_point"] == []
    w.stop()
    (tmp_path / "two").mkdir()
    two = load_queue(str(CORPUS / "reap_two_trips.py"))
    r = redis_server.connect(redis_url, decode_responses=True)
    two.enqueue(r, {"doc_id": 2, "text": "short"}, "doc-2")
    assert two.claim(r, 0.05)[0] == "doc-2"
    time.sleep(0.2)
    w = Worker(redis_url, tmp_path / "two", "--queue",
               str(CORPUS / "reap_two_trips.py"), CRASH_POINT="mid-reap", CRASH_P=1,
               **env)
    workers.append(w)
    assert w.proc.wait(timeout=60) == -signal.SIGKILL
    crash = [e for e in w.read() if e["ev"] == "crash_point"]
    assert [(e["point"], e["call"]) for e in crash] == [("mid-reap", "reap")]
    assert two.claim(r, 30) is None            # the reap died holding doc-2


def _armed_reaper(redis_url, tmp_path, queue: str, hosted: bool):
    """A --reap-only reaper armed by SIGUSR1, then, once a reap has started
    armed, a lease (doc-3) that runs out. (Timed instead, from the start, an
    unarmed first reap slow to start its host under load took the lease.)"""
    from handson.queues.contract import load_queue

    mod = load_queue(str(CORPUS / queue))
    r = redis_server.connect(redis_url, decode_responses=True)
    r.flushdb()
    env = {"EO_LEARNER_PREFIX": "[]"} if hosted else {}
    w = Worker(redis_url, tmp_path, "--queue", str(CORPUS / queue), "--reap-only",
               "--pause-mid-reap", **env)
    w.wait_for(lambda ev: "start" in _kinds(ev), timeout=60)
    os.kill(w.proc.pid, signal.SIGUSR1)
    w.wait_for(lambda ev: "reap_armed" in _kinds(ev), timeout=60)
    mod.enqueue(r, {"doc_id": 3, "text": "short"}, "doc-3")
    assert mod.claim(r, 1.5)[0] == "doc-3"
    return mod, r, w


@pytest.mark.parametrize("hosted", [False, True], ids=["local", "hosted"])
def test_an_armed_reaper_stops_between_reading_a_job_and_acting_on_it(
        redis_url, tmp_path, workers, hosted):
    """A reap that reads the expired lease, then requeues in later round trips,
    stops right after the read (SIGSTOP, its own or its host's call held);
    meanwhile the job is reaped and claimed again; resumed, it requeues the job
    its new owner holds, which the next claim gets as a third attempt."""
    from handson.faults.pool import _stopped

    mod, r, w = _armed_reaper(redis_url, tmp_path, "reap_not_atomic.py", hosted)
    workers.append(w)
    events = w.wait_for(lambda ev: "reaper_paused" in _kinds(ev), timeout=60)
    assert [e["jobs"] for e in events if e["ev"] == "reaper_paused"] == [["doc-3"]]
    deadline = time.monotonic() + 10
    while not _stopped(w.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _stopped(w.proc.pid)
    assert mod.reap(r, 3) == (1, 0)
    assert mod.claim(r, 30)[0::2] == ("doc-3", 2)      # its new owner
    os.killpg(w.proc.pid, signal.SIGCONT)
    events = w.wait_for(lambda ev: "reap_after_pause" in _kinds(ev), timeout=60)
    assert [e["requeued"] for e in events if e["ev"] == "reap_after_pause"] == [1]
    assert mod.claim(r, 30)[0::2] == ("doc-3", 3)      # handed out twice


@pytest.mark.parametrize("hosted", [False, True], ids=["local", "hosted"])
def test_an_armed_reaper_with_one_script_has_no_gap_to_stop_in(
        redis_url, tmp_path, workers, hosted):
    mod, r, w = _armed_reaper(redis_url, tmp_path, "mini_correct.py", hosted)
    workers.append(w)
    events = w.wait_for(lambda ev: "reap_no_gap" in _kinds(ev), timeout=60)
    assert "reaper_paused" not in _kinds(events)
    assert mod.claim(r, 30)[0::2] == ("doc-3", 2)
    assert mod.claim(r, 30) is None


DEAF_CLAIM = '''
import sys

from handson import q as _q
from handson.q import *  # noqa: F403   the reference queue, except that...


def claim(r, lease_s, *, queue="q"):    # ...its claim disarms the kill it carries
    sys.modules["__main__"]._ARMED.after = None
    return _q.claim(r, lease_s, queue=queue)
'''


HONEST = "from handson.q import *  # noqa: F403\n"


@pytest.mark.parametrize("source", [HONEST, DEAF_CLAIM], ids=["honest", "deaf"])
def test_a_queue_host_that_disarms_its_kill_is_done_but_never_killed(
        r, redis_url, tmp_path, workers, source):
    """Hosted like a learner's queue, every claim is armed. The honest host dies
    inside it; the one that unarms itself lives, and no kill is logged, so a
    chaos run of it falls short of its kill quota and is unknown (test_chaos)."""
    path = tmp_path / "hosted.py"
    path.write_text(source)
    q.enqueue(r, {"doc_id": 1, "text": "short"}, "doc-1")
    w = Worker(redis_url, tmp_path, "--queue", str(path), CRASH_POINT="mid-claim",
               CRASH_P=1, EO_LEARNER_PREFIX="[]")
    workers.append(w)
    if source == HONEST:
        assert w.proc.wait(timeout=60) == -signal.SIGKILL
        crash = [e for e in w.read() if e["ev"] == "crash_point"]
        assert [(e["point"], e["call"]) for e in crash] == [("mid-claim", "claim")]
        return
    events = w.wait_for(lambda ev: "ack" in _kinds(ev, "doc-1"), timeout=60)
    assert [e for e in events if e["ev"] == "crash_point"] == []
    assert w.proc.poll() is None


def test_unknown_crash_point_and_missing_redis_url_say_what_to_do(redis_url,
                                                                 tmp_path):
    run = lambda env: subprocess.run(
        [sys.executable, "-m", "handson.worker", "--db", str(tmp_path / "x.db")],
        env=env, capture_output=True, text=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    res = run(env)
    assert res.returncode != 0 and "REDIS_URL is not set" in res.stderr
    res = run(dict(env, REDIS_URL=redis_url, CRASH_POINT="before-lunch"))
    assert res.returncode != 0 and ("CRASH_POINT: unknown crash point 'before-lunch'"
                                    in res.stderr), res.stderr
