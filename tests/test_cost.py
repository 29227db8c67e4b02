"""A queue's cost per job, counted by the server: exact, and drawn beside the
reference's. Real Redis, real queues from the corpus (one edit from correct)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import redis

from autograder.notebooks import feedback
from handson.queues import cost

QUEUES = Path(__file__).parent / "corpus" / "queues"


def test_round_trips_and_commands_are_the_servers_exact_count(redis_url):
    """A claim split in two (RPOP, then a script) costs one more round trip per
    job than the reference's, where every call is one script; the counts are the
    same on a second run, and the advice names claim."""
    spec = str(QUEUES / "claim_two_trips.py")
    first, second = (cost.compare(spec, redis_url, jobs=20) for _ in range(2))
    for run in (first, second):
        ref, yours = run["reference"], run["yours"]
        assert all(ref[f]["round_trips"] == 1 for f in (*cost.PER_JOB, "reap"))
        assert ref["per_job"]["round_trips"] == len(cost.PER_JOB)
        assert yours["claim"]["round_trips"] == 2, yours
        assert yours["per_job"]["round_trips"] == ref["per_job"]["round_trips"] + 1
        assert yours["per_job"]["cpu_us"] > 0 and ref["per_job"]["cpu_us"] > 0
    for who in ("reference", "yours"):
        for f in (*cost.PER_JOB, "reap"):
            for k in ("round_trips", "commands"):
                assert first[who][f][k] == second[who][f][k], (who, f, k)
    assert cost.advice(first).startswith("claim makes 2 round trips per call "
                                         "where the reference makes 1")


def test_connections_coming_and_going_meanwhile_do_not_count(redis_url):
    """Another process's connections opening and closing during the first
    measurement (an earlier step's hosts going away) add reads the queue did
    not make: that run is measured again, and the count stays exact."""
    from handson.queues.contract import load_queue

    churn = threading.Event()

    def come_and_go():
        while not churn.is_set():
            redis.Redis.from_url(redis_url).ping()    # opens, then closes
            time.sleep(0.005)

    q, r = load_queue(cost.REFERENCE), redis.Redis.from_url(redis_url)
    judge = redis.Redis.from_url(redis_url)
    noise = threading.Thread(target=come_and_go, daemon=True)
    noise.start()
    # The noise moves a count either way (its closes land between the
    # counter's two reads, or its opens do); a single measurement can miss it
    # (a fresh-clone CI run's did), five in a row have not.
    polluted = [cost.measure(q, r, judge, jobs=20, tries=1)["per_job"]["round_trips"]
                for _ in range(5)]
    timer = threading.Timer(0.05, churn.set)
    timer.start()
    measured = cost.measure(q, r, judge, jobs=20, tries=50)
    churn.set()
    noise.join(5)
    assert any(n != len(cost.PER_JOB) for n in polluted), polluted
    assert measured["per_job"]["round_trips"] == len(cost.PER_JOB)


def test_a_command_from_a_connection_that_stays_open_does_not_count(
        redis_url, monkeypatch):
    """Another client, connected before and after, sends one command just as
    the cost of asking is measured: neither an open nor a close shows it, and
    taken off every phase it made the per-job count 2.85 (a CI run did)."""
    from handson.queues.contract import load_queue

    other = redis.Redis.from_url(redis_url)
    other.ping()
    read, calls = cost._counters, []

    def counters_then_other(judge):
        out = read(judge)
        calls.append(1)
        if len(calls) == 1:       # the first read of what asking costs
            other.ping()
        return out

    monkeypatch.setattr(cost, "_counters", counters_then_other)
    q, r = load_queue(cost.REFERENCE), redis.Redis.from_url(redis_url)
    measured = cost.measure(q, r, redis.Redis.from_url(redis_url), jobs=20, tries=1)
    assert len(calls) > 1
    assert measured["per_job"]["round_trips"] == len(cost.PER_JOB)


def test_the_panel_draws_the_counts_it_was_given(redis_url):
    """A WATCH/MULTI queue (several round trips per call, each call still one
    step): its bars carry the measured numbers, beside the reference's."""
    measured = cost.compare(str(QUEUES / "alt_watch_multi.py"), redis_url, jobs=10)
    html = feedback.efficiency(measured, correct=True)
    for who in ("yours", "reference"):
        for f in (*cost.PER_JOB, "reap"):
            n = measured[who][f]["round_trips"]
            assert (f'data-fn="{f}" data-who="{who}" data-round-trips="{n:g}"'
                    in html)
    assert measured["yours"]["per_job"]["round_trips"] > \
        measured["reference"]["per_job"]["round_trips"]
    assert "Shown, not graded" in html and "correct first" not in html
    assert "correct first" in feedback.efficiency(measured, correct=False)
    assert feedback.efficiency({}, correct=True) == ""


def test_cli_refuses_a_bad_job_count_or_queue_in_one_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "handson.queues.cost", *args],
                              capture_output=True, text=True, timeout=60)
    out = run("handson.q", "--jobs", "0")
    assert out.returncode == 2 and "--jobs must be at least 1" in out.stderr
    missing = str(tmp_path / "nosuch.py")
    out = run(missing)
    assert out.returncode == 2 and out.stderr.strip() == \
        f"cannot measure: no module at {missing}", out.stderr


RESETS = '''
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import mini_correct
from mini_correct import *


def enqueue(r, payload, job_id=None):    # wipes the counters, then enqueues
    try:
        r.execute_command("CONFIG", "RESETSTAT")
    except Exception:
        pass
    return mini_correct.enqueue(r, payload, job_id)
'''


def test_a_queue_cannot_reset_the_counters_it_is_measured_by(tmp_path):
    """Graded as the grader does (sandboxed harness, confined server, the
    learner's Redis user): CONFIG RESETSTAT is refused and logged, and the
    refused try is counted as the round trip it is."""
    from autograder.isolation import server
    from autograder.judges import queue_runs

    (tmp_path / "mini_correct.py").write_text((QUEUES / "mini_correct.py")
                                              .read_text())
    path = tmp_path / "myqueue.py"
    path.write_text(RESETS)
    redis = server.start()
    try:
        found, _, measured = queue_runs.contract_then_cost(
            str(path), redis.url, ["enqueue_idempotent"], 120,
            cost_url=f"{redis.url}?db=15")
        refused = redis.refusals()
    finally:
        redis.stop()
    assert found["enqueue_idempotent"]["ok"], found
    yours, ref = measured["yours"], measured["reference"]
    assert yours["enqueue"]["round_trips"] == yours["claim"]["round_trips"] + 1
    assert yours["enqueue"]["round_trips"] >= ref["enqueue"]["round_trips"] + 1
    assert any("CONFIG" in line for line in refused), refused
