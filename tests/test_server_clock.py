"""A step of the server's wall clock is the server's doing, not the queue's.

A correct queue whose leases run on Redis TIME reaps every lease early when
that clock is stepped forward (a resumed virtual machine does this); the judge
must not call the early re-claims "handed out twice". Stepping the real clock
in a test would move it for the whole machine, so the judge is fed readings.
"""

from types import SimpleNamespace

from handson.faults.engine import ChaosConfig
from handson.faults.judge import _Judge
from handson.faults.server_clock import ServerClock

MS = 1_000_000
BASE = 1_700_000_000 * 10**9          # the server's wall clock at monotonic 0


def _clock(step_at_ms: float | None = None, step_ms: float = 0,
           every_ms: int = 250, until_ms: int = 3000) -> ServerClock:
    """Readings every 250 ms, 0.1 ms round trips; one step if asked."""
    clock = ServerClock()
    for at in range(0, until_ms, every_ms):
        jump = step_ms if step_at_ms is not None and at >= step_at_ms else 0
        clock.record(at * MS, at * MS + MS // 10, BASE + int((at + jump) * MS))
    return clock


def test_a_step_forward_counts_only_between_readings_that_span_it():
    clock = _clock(step_at_ms=1300, step_ms=700)
    assert clock.gained_ns(1000 * MS, 1700 * MS) >= 700 * MS
    assert clock.gained_ns(1000 * MS, 1700 * MS) < 701 * MS
    assert clock.gained_ns(200 * MS, 900 * MS) < MS         # before the step
    assert clock.gained_ns(1800 * MS, 2600 * MS) < MS       # after it
    assert clock.gained_ns() >= 700 * MS                    # the whole run


def test_a_step_backward_or_a_steady_clock_gains_nothing():
    assert _clock().gained_ns() < MS
    assert _clock(step_at_ms=1300, step_ms=-700).gained_ns() < MS


def test_a_slow_reading_is_dropped():
    clock = ServerClock()
    clock.record(0, 50 * MS, BASE)
    assert clock.at == []


def _judge(clock: ServerClock) -> _Judge:
    """Attempt 1 claimed at 1.000 s, its worker killed at 1.003 s; attempt 2
    claimed by another worker at 1.700 s: 0.7 s into a 1 s lease."""
    judge = _Judge.__new__(_Judge)
    judge.cfg = ChaosConfig(lease_s=1.0)
    judge.run = SimpleNamespace(kills=[(1003 * MS, 11)], server_clock=clock)
    judge.events = [
        {"ev": "claim", "job": "doc-1", "pid": 11, "attempt": 1,
         "t0": 999 * MS, "t": 1000 * MS},
        {"ev": "claim", "job": "doc-1", "pid": 12, "attempt": 2,
         "t0": 1699 * MS, "t": 1700 * MS},
        {"ev": "ack", "job": "doc-1", "pid": 12, "attempt": 2, "t": 1710 * MS},
    ]
    judge.by_job = {"doc-1": judge.events}
    return judge


def test_re_claim_inside_the_lease_is_handed_out_twice_on_a_steady_clock():
    judge = _judge(_clock())
    assert judge._handed_twice() == ["doc-1"]
    assert "handed out twice" in judge._why_again((1, 11, 1000 * MS), None,
                                                  1700 * MS)


def test_re_claim_after_the_server_clock_stepped_past_the_lease_is_not():
    judge = _judge(_clock(step_at_ms=1300, step_ms=700))
    assert judge._handed_twice() == []
    assert "it was reaped" in judge._why_again((1, 11, 1000 * MS), None, 1700 * MS)


def test_a_step_too_small_to_expire_the_lease_still_convicts():
    judge = _judge(_clock(step_at_ms=1300, step_ms=100))
    assert judge._handed_twice() == ["doc-1"]


def test_heartbeat_trial_sets_aside_long_jobs_runs_the_learner_did_not_fail():
    """A run whose server clock jumped, or that lost a lease while the machine
    held the grader, is run again, up to three times; the last is judged unless
    the kernel says the machine held the workers."""
    from autograder.judges.heartbeat_trial import _long_jobs_until_a_fair_run as fair

    runs = iter([{"clock_gained_ms": 700.0, "acks": "first"},
                 {"clock_gained_ms": 0.4, "acks": "second"}])
    got = fair(lambda: next(runs))
    assert got["acks"] == "second" and "gained 700 ms" in got["rerun"]
    steady = iter([{"clock_gained_ms": 0.4, "acks": "only"}])
    assert fair(lambda: next(steady)) == {"clock_gained_ms": 0.4, "acks": "only"}
    # lost a lease while held: again; held but nothing lost: judged as it is
    held = iter([{"requeued": 2, "stall_ms": 400.0, "acks": "first"},
                 {"requeued": 0, "stall_ms": 400.0, "acks": "second"}])
    got = fair(lambda: next(held))
    assert got["acks"] == "second" and "held the grader for 400 ms" in got["rerun"]
    # a module that keeps the machine busy is still judged, on its third run
    busy = iter([{"requeued": 1, "stall_ms": 300.0, "acks": n} for n in range(5)])
    got = fair(lambda: next(busy))
    assert got["acks"] == 2 and got["rerun"].startswith("2 earlier run(s)")
    assert "excused" not in got
    # ... unless the kernel counts its workers waiting for a CPU as it lost one
    held = iter([{"requeued": 1, "held_ms": 250.0, "acks": n} for n in range(5)])
    got = fair(lambda: next(held))
    assert got["acks"] == 2 and "waited 250 ms for a CPU" in got["excused"]
    # ... a third of the 0.6 s lease at least
    short = iter([{"requeued": 1, "held_ms": 150.0, "acks": n} for n in range(5)])
    assert "excused" not in fair(lambda: next(short))


def test_heartbeat_trial_runs_frozen_again_when_the_second_worker_lost_its_lease():
    """The frozen trial is about the frozen worker: a run whose second worker
    lost its own lease (the job undone) is run again; the third is judged."""
    from autograder.judges.heartbeat_trial import _frozen_until_a_fair_run as fair

    lost = {"ev": "result", "held": False}
    held = {"ev": "result", "held": True}
    runs = iter([{"second": [lost], "n": 1}, {"second": [held], "n": 2}])
    got = fair(lambda: next(runs))
    assert got["n"] == 2 and got["rerun"].startswith("1 earlier run(s)")
    always = iter([{"second": [lost], "n": n} for n in range(5)])
    got = fair(lambda: next(always))
    assert got["n"] == 2 and "lost its own lease" in got["rerun"]
    once = iter([{"second": [held], "n": 0}])
    assert "rerun" not in fair(lambda: next(once))


def test_a_trial_run_again_starts_from_an_empty_table_and_log(tmp_path):
    """A set-aside long_jobs run is run again in the same folder: its table and
    event log must start empty (they once made the rerun crash)."""
    import sqlite3

    from autograder.judges.heartbeat_trial import _effects, _events, _log, _setup

    db, events = _setup(tmp_path, "long")
    con = sqlite3.connect(db)
    con.execute("INSERT INTO effects VALUES ('long-0', 1, 1)")
    con.commit()
    con.close()
    _log(events, ev="claim")
    assert _effects(db) and _events(events)
    assert _setup(tmp_path, "long") == (db, events)
    assert _effects(db) == {} and _events(events) == []


def test_the_report_says_how_much_the_clock_gained_only_when_it_did():
    from handson.faults.engine import Report

    stats = {"kills": 0, "crash_kills": 0, "pauses": 0, "dlq": 0, "elapsed_s": 1.0,
             "unacked": {"died": 0, "refused": 0, "unlogged": 0},
             "applied_histogram": {}, "delivery_histogram": {}}
    text = lambda ms: Report(ChaosConfig(), "valid", "", {},
                             dict(stats, server_clock_gained_ms=ms), "cmd").text()
    assert "clock gained 704 ms on the workers'" in text(703.9)
    assert "clock gained" not in text(4.8)


def test_the_notebook_states_the_lease_and_jobs_the_trial_runs():
    """What the heartbeats notebook tells the learner the grader runs is read
    from the trial's constants: change one, and this says the text is stale."""
    import json

    from autograder.judges import heartbeat_trial as ht
    from autograder.notebooks import notebook

    for folder in (notebook.SOURCE_DIR, notebook.RELEASE_DIR):
        nb = json.loads((folder / "heartbeats" / "heartbeats.ipynb").read_text())
        text = " ".join("".join(c["source"]) for c in nb["cells"]).replace("\n", " ")
        assert (f"jobs of {ht.WORK_S:g} s on a lease of {ht.LONG_LEASE_S:g} s"
                in text), folder
