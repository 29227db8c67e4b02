"""The reference queue on a real Redis: the contract's checks, then what only q has."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from redis.crc import key_slot

from handson import q
from handson.queues import checks, crowds
from handson.redis_server import connect


@pytest.mark.parametrize("name", list(checks.CHECKS))
def test_contract(name, redis_url):
    """Each contract semantic, checked by the one module that checks contracts."""
    [res] = checks.run_checks("handson.q", redis_url, [name])
    assert res.ok, res.line()


def _expire(lease_s: float) -> None:
    time.sleep(lease_s + 0.2)


def test_queue_full_at_the_bound(r):
    for i in range(3):
        q.enqueue(r, {"i": i}, f"j{i}", max_pending=3)
    with pytest.raises(q.QueueFull, match="3 jobs pending"):
        q.enqueue(r, {"i": 3}, "j3", max_pending=3)
    assert q.enqueue(r, {"i": 0}, "j0", max_pending=3) == "j0"   # known id: no error
    assert q.stats(r)["pending"] == 3


def test_queue_max_from_environment(r, monkeypatch):
    monkeypatch.setenv("QUEUE_MAX", "2")
    q.enqueue(r, {}, "a")
    q.enqueue(r, {}, "b")
    with pytest.raises(q.QueueFull):
        q.enqueue(r, {}, "c")


def test_redrive_gives_a_fresh_budget_and_attempts_keep_growing(r):
    q.enqueue(r, {"text": "POISON"}, "p")
    for _ in range(2):
        q.claim(r, 0.05)
        _expire(0.05)
        q.reap(r, 2)
    details = q.dead_details(r)
    assert [(d["job_id"], d["attempts"]) for d in details] == [("p", 2)]
    assert details[0]["last_error"] == q.LEASE_EXPIRED
    server_now = r.time()[0]
    assert abs(details[0]["died_at"] - server_now) < 5      # server clock, seconds

    assert q.redrive(r) == 1
    assert q.dead(r) == []
    job = q.claim(r, 0.05)
    assert job[0] == "p" and job[2] == 3                    # the token only grows
    _expire(0.05)
    assert q.reap(r, 2) == (1, 0)                           # budget counts from 0


def test_stats_and_oldest_pending_age(r):
    assert q.stats(r) == {"pending": 0, "inflight": 0, "dead": 0,
                          "oldest_pending_age_s": 0.0, "done": 0}
    t0 = time.monotonic()
    q.enqueue(r, {}, "old")
    time.sleep(0.2)
    t_new = time.monotonic()
    q.enqueue(r, {}, "new")
    q.enqueue(r, {}, "claimed")
    q.claim(r, 30)                          # takes "old" (FIFO)
    s = q.stats(r)
    since_new = time.monotonic() - t_new
    assert (s["pending"], s["inflight"], s["dead"]) == (2, 1, 0)
    assert s["oldest_pending_age_s"] <= since_new + 0.01   # "old" left pending
    q.enqueue(r, {}, "x")
    job = q.claim(r, 0.05)
    assert job[0] == "new"
    _expire(0.05)
    q.reap(r, 3)                            # requeued: its age counts from enqueue
    s = q.stats(r)
    elapsed = time.monotonic() - t0
    assert 0.2 <= s["oldest_pending_age_s"] <= elapsed + 0.01


def test_all_keys_share_one_hash_tag(r):
    assert all(k.startswith("{q}:") for k in q.KEYS)
    assert len({key_slot(k.encode()) for k in q.KEYS}) == 1
    q.enqueue(r, {}, "a")
    q.enqueue(r, {}, "b")
    q.enqueue(r, {}, "c")
    a, b, c = (q.claim(r, 0.05) for _ in range(3))
    q.fail(r, "b", b[2], "boom")
    q.ack(r, "a", a[2])
    _expire(0.05)
    q.reap(r, 1)
    q.stats(r)
    keys = {k.decode() for k in r.keys("*")}
    assert keys and keys <= set(q.KEYS), keys - set(q.KEYS)


def test_claim_and_ack_are_one_round_trip_each(r):
    calls = []
    original = r.execute_command

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    q.enqueue(r, {}, "warm")
    q.ack(r, *q.claim(r, 30)[::2])          # loads the scripts
    q.enqueue(r, {}, "j")
    r.execute_command = counting
    job = q.claim(r, 30)
    assert calls == ["EVALSHA"]
    assert q.ack(r, job[0], job[2])
    assert calls == ["EVALSHA", "EVALSHA"]


def test_ack_and_claim_is_one_round_trip(r):
    calls = []
    original = r.execute_command

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    for job_id in ("warm", "a", "b"):
        q.enqueue(r, {"id": job_id}, job_id)
    job = q.claim(r, 30)
    assert q.ack_and_claim(r, job[0], job[2], 30)[0]     # loads the script
    r.execute_command = counting
    acked, nxt = q.ack_and_claim(r, "a", 1, 30)
    assert calls == ["EVALSHA"]
    assert acked and nxt == ("b", {"id": "b"}, 1)
    assert q.status(r, "a") == "done" and q.status(r, "b") == "inflight"
    assert q.ack_and_claim(r, "b", 1, 30) == (True, None)   # nothing left


def test_ack_and_claim_is_fenced_like_ack(r):
    """A zombie's ack is refused, a failed attempt's too; the claim goes on."""
    for job_id in ("z", "n1", "n2", "n3"):
        q.enqueue(r, {}, job_id)
    first = q.claim(r, 0.05)
    _expire(0.05)
    assert q.reap(r, 3) == (1, 0)
    owner = q.claim(r, 30)                  # "z" went to the back: n1 comes first
    assert owner[0] == "n1"
    acked, nxt = q.ack_and_claim(r, "z", first[2], 30)
    assert not acked and nxt[0] == "n2"     # the zombie is refused, still fed
    assert q.fail(r, "n2", nxt[2], "boom")
    acked, nxt = q.ack_and_claim(r, "n2", 1, 30)
    assert not acked and nxt[0] == "n3"     # a failed attempt cannot ack
    acked, nxt = q.ack_and_claim(r, "n3", nxt[2], 30)
    assert acked and nxt[0] == "z" and nxt[2] == 2
    assert q.ack(r, "z", 2)
    assert q.status(r, "n3") == "done" and q.status(r, "n2") == "inflight"


def test_ack_and_claim_keeps_attempts_and_the_dead_letter_rule(r):
    """A prefetched job whose worker dies uses its attempt: two deaths, the DLQ."""
    for job_id in ("done", "p", "other"):
        q.enqueue(r, {}, job_id)
    job = q.claim(r, 30)
    acked, nxt = q.ack_and_claim(r, job[0], job[2], 0.05)
    assert acked and nxt[0] == "p" and nxt[2] == 1
    _expire(0.05)                           # the worker died: "p" never seen
    assert q.reap(r, 2) == (1, 0)
    job = q.claim(r, 30)                    # "other", then "p" again
    acked, nxt = q.ack_and_claim(r, job[0], job[2], 0.05)
    assert acked and nxt[0] == "p" and nxt[2] == 2
    _expire(0.05)
    assert q.reap(r, 2) == (0, 1)
    assert q.dead(r) == [("p", 2, q.LEASE_EXPIRED)]


def test_an_ack_leaves_no_field_of_its_job_however_it_got_there(r):
    """First attempt, a retry after an error, a redrive: each ack clears all."""
    def fields(job_id):
        return [f for f in r.hkeys(q.JOBS) if f.decode().endswith(":" + job_id)]

    for job_id in ("first", "retried", "redriven"):
        q.enqueue(r, {}, job_id)
    assert q.ack(r, "first", q.claim(r, 30)[2]) and fields("first") == []
    job = q.claim(r, 30)
    assert q.fail(r, "retried", job[2], "boom") and q.reap(r, 3) == (1, 0)
    job = q.claim(r, 0.05)                  # "redriven" dies in its lease
    _expire(0.05)
    assert q.reap(r, 1) == (0, 1) and q.redrive(r) == 1
    for _ in range(2):
        job = q.claim(r, 30)
        assert job[2] == 2 and fields(job[0])
        assert q.ack(r, job[0], job[2]) and fields(job[0]) == []
    assert r.hlen(q.JOBS) == 0


def test_batch_claim_and_ack_are_fenced(r):
    for i in range(5):
        q.enqueue(r, {"i": i}, f"b{i}")
    first = q.claim_batch(r, 0.05, 10)
    assert [j[0] for j in first] == [f"b{i}" for i in range(5)]
    assert all(j[2] == 1 for j in first)
    _expire(0.05)
    assert q.reap(r, 3) == (5, 0)
    second = q.claim_batch(r, 30, 3)
    assert len(second) == 3 and all(j[2] == 2 for j in second)
    zombies = [(j[0], j[2]) for j in first[:3]]
    assert q.ack_batch(r, zombies) == [False, False, False]
    owners = [(j[0], j[2]) for j in second]
    assert q.ack_batch(r, owners[:2] + zombies[2:]) == [True, True, False]
    assert q.ack_batch(r, owners[2:]) == [True]
    assert q.ack_batch(r, []) == []


def test_fail_ends_the_lease_and_keeps_the_error(r):
    q.enqueue(r, {}, "f")
    job = q.claim(r, 30)
    assert q.fail(r, "f", job[2], "ValueError: cannot tokenize")
    assert not q.ack(r, "f", job[2])        # failed: handed to reap
    assert not q.extend(r, "f", job[2], 30)
    assert q.reap(r, 1) == (0, 1)
    assert q.dead(r) == [("f", 1, "ValueError: cannot tokenize")]


def test_done_marker_expires_after_retention(r, monkeypatch):
    monkeypatch.setenv("QUEUE_DONE_TTL_S", "0.5")
    q.enqueue(r, {}, "d")
    assert q.ack(r, "d", q.claim(r, 30)[2])
    q.enqueue(r, {}, "d")
    assert q.claim(r, 30) is None           # within retention: the same job
    time.sleep(0.6)
    q.enqueue(r, {}, "d")
    again = q.claim(r, 30)
    assert again is not None and again[2] == 1   # after retention: a new job


def test_status_follows_the_job(r):
    assert q.status(r, "s") is None
    q.enqueue(r, {}, "s")
    assert q.status(r, "s") == "pending"
    job = q.claim(r, 0.05)
    assert q.status(r, "s") == "inflight"
    _expire(0.05)
    q.reap(r, 1)
    assert q.status(r, "s") == "dead"
    q.redrive(r)
    job = q.claim(r, 30)
    q.ack(r, "s", job[2])
    assert q.status(r, "s") == "done"


def test_reset_deletes_only_queue_keys(r):
    r.set("someone-else", "1")
    q.enqueue(r, {}, "a")
    q.reset(r)
    assert r.keys("*") == [b"someone-else"]


def test_works_with_decoded_responses(redis_url, r):
    rd = connect(redis_url, decode_responses=True)
    q.enqueue(rd, {"x": "é"}, "u")
    assert q.claim(rd, 30) == ("u", {"x": "é"}, 1)
    assert q.ack(rd, "u", 1)
    rd.close()


def test_heartbeat_from_a_thread_survives_concurrent_reapers(r, redis_url):
    """Many jobs heartbeating while several reapers run: none is taken away.

    The lease is long enough (2 s, a beat every 0.67 s) that only a stall of
    the beating thread past 1.3 s loses it: at 0.5 s the suite's own load
    stalled it past a lease in a fresh-clone run."""
    lease = 2.0
    for i in range(10):
        q.enqueue(r, {}, f"h{i}")
    jobs = q.claim_batch(r, lease, 10)
    stop = threading.Event()
    refused = []

    def beat():
        hb = connect(redis_url)
        while not stop.wait(lease / 3):
            refused.extend(j for j in jobs if not q.extend(hb, j[0], j[2], lease))
        hb.close()

    def reaper(out):
        rr = connect(redis_url)
        while not stop.is_set():
            out.append(q.reap(rr, 3))
            time.sleep(0.02)
        rr.close()

    results = [[] for _ in range(3)]
    threads = [threading.Thread(target=beat)] + [
        threading.Thread(target=reaper, args=(out,)) for out in results]
    for t in threads:
        t.start()
    time.sleep(4 * lease)
    stop.set()
    for t in threads:
        t.join(10)
    assert not refused
    assert all(res == (0, 0) for out in results for res in out)
    assert q.ack_batch(r, [(j[0], j[2]) for j in jobs]) == [True] * 10



def test_operator_commands(r, redis_url):
    env = dict(os.environ, REDIS_URL=redis_url)
    run = lambda *a: subprocess.run([sys.executable, "-m", "handson.q", *a], env=env,
                                    capture_output=True, text=True, timeout=60)
    q.enqueue(r, {}, "p")
    q.fail(r, "p", q.claim(r, 30)[2], "ValueError: cannot tokenize")
    q.reap(r, 1)
    out = run("stats")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["dead"] == 1
    dead_out = run("dead").stdout
    assert dead_out.startswith("p\tattempts=1\tdied=")
    assert "ValueError: cannot tokenize" in dead_out
    assert run("redrive").stdout.strip() == "redrove 1 jobs"
    assert q.stats(r)["pending"] == 1


def test_expired_but_unreaped_lease_still_belongs_to_its_attempt(r):
    q.enqueue(r, {}, "slow")
    job = q.claim(r, 0.05)
    _expire(0.05)
    assert q.extend(r, "slow", job[2], 30)      # nobody else holds it yet
    assert q.reap(r, 3) == (0, 0)
    assert q.ack(r, "slow", job[2])


def test_reap_does_bounded_work_per_call(r, monkeypatch):
    monkeypatch.setattr(q, "REAP_LIMIT", 2)
    for i in range(3):
        q.enqueue(r, {}, f"r{i}")
    q.claim_batch(r, 0.05, 3)
    _expire(0.05)
    assert q.reap(r, 3) == (2, 0)
    assert q.reap(r, 3) == (1, 0)


def test_a_failed_attempt_retried_can_be_acked(r):
    q.enqueue(r, {}, "flaky")
    first = q.claim(r, 30)
    assert q.fail(r, "flaky", first[2], "TimeoutError: sink busy")
    assert q.reap(r, 3) == (1, 0)
    second = q.claim(r, 30)
    assert second[2] == first[2] + 1
    assert not q.ack(r, "flaky", first[2])
    assert q.ack(r, "flaky", second[2])
    assert q.status(r, "flaky") == "done"


def test_done_markers_are_pruned_by_reap_in_bounded_steps(r, monkeypatch):
    monkeypatch.setenv("QUEUE_DONE_TTL_S", "0.3")
    monkeypatch.setattr(q, "REAP_LIMIT", 2)
    for i in range(3):
        q.enqueue(r, {}, f"d{i}")
        assert q.ack(r, f"d{i}", q.claim(r, 30)[2])
    assert q.stats(r)["done"] == 3
    time.sleep(0.4)
    q.enqueue(r, {}, "e")                   # enqueue leaves the markers alone
    assert q.stats(r)["done"] == 3
    q.reap(r, 3)                            # reap prunes, at most REAP_LIMIT
    assert q.stats(r)["done"] == 1
    q.reap(r, 3)
    assert q.stats(r)["done"] == 0
    q.enqueue(r, {}, "d0")                  # expired: a new job, not a marker
    assert q.status(r, "d0") == "pending"


def test_batches_of_any_size_and_any_id(r):
    ids = [f"b{i}" for i in range(1200)] + ["~" * 65, "x y\nz"]
    for job_id in ids:
        q.enqueue(r, {"id": job_id}, job_id, max_pending=2000)
    jobs = q.claim_batch(r, 30, 2000)
    assert [j[0] for j in jobs] == ids
    assert all(j[1] == {"id": j[0]} and j[2] == 1 for j in jobs)
    pairs = [(j[0], j[2]) for j in jobs]
    assert q.ack_batch(r, pairs + pairs[:1]) == [True] * len(ids) + [False]
    assert q.stats(r)["inflight"] == 0 and q.stats(r)["done"] == len(ids)


def test_a_claimer_that_empties_the_queue_between_kills_gets_more_jobs(
        redis_url, monkeypatch):
    """Between two kills a claimer can take every pending job (its killer was
    starved of CPU), and then it claims nothing: that is not a queue that makes
    a new worker wait, so the check enqueues more. Eight jobs for 24 kills."""
    monkeypatch.setattr(crowds._claims_survive_kills, "__defaults__", (8, 1, 24))
    [res] = checks.run_checks("handson.q", redis_url, ["claim_atomic_concurrent"])
    assert res.ok, res.line()
