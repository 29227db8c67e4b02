"""The judge trusts its own records, never something the learner's code controls.

Each attack is staged for real and must earn nothing: a queue that drops jobs
and lists them as dead, a queue that never hands out a job, a heartbeat that
hides a thread from `threading`, and links in the learner's folders that would
make the grader write (or the learner's host write) somewhere else.
"""

import json
import os
import shutil
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.grade import replayable
from autograder.isolation import sandbox
from autograder.judges import claim_ack_reap, heartbeat_trial, heartbeats, queue_runs
from handson.faults.engine import ChaosConfig, run
from handson.faults.judge import _Judge
from handson.infra import remote_module
from handson.redis_server import connect

QUEUES = Path(__file__).parent / "corpus" / "queues"
RUNS = json.loads((QUEUES / "chaos_runs.json").read_text())


def _chaos_grades(report: dict) -> dict:
    """check name -> Outcome, as claim_ack_reap maps one chaos report."""
    outcomes, _, _ = claim_ack_reap._chaos_outcomes([report], "myqueue.py", "x")
    return {o.name: o for o in outcomes}


def test_jobs_listed_dead_but_never_claimed_are_lost(redis_url):
    """dead() is the queue's word: a job no worker's log shows claimed is lost."""
    cfg = ChaosConfig(queue=str(QUEUES / "dead_hides_lost.py"), seed=1,
                      **RUNS["dead_hides_lost"]["config"])
    report = json.loads(run(cfg, redis_url=redis_url).to_json())
    lost = report["invariants"]["lost"]
    assert lost["ok"] is False and lost["count"] >= report["stats"]["enqueued"] // 8
    assert "no worker's log shows it claimed" in lost["witnesses"][0]
    by = _chaos_grades(report)
    assert not by["chaos_nothing_lost"].ok and by["chaos_nothing_lost"].points == 0
    assert "in the DLQ after 0 attempts" in by["chaos_nothing_lost"].witnesses[0]
    assert all(by[n].ok for n in by if n != "chaos_nothing_lost"), by


def test_only_a_worker_killed_in_its_loop_may_hide_a_claim():
    """A kill excuses an unlogged claim only if the worker had logged its start
    and held no job: one killed while still starting never claimed (counting
    those once let a loaded run excuse every job dead_hides_lost dropped)."""
    judge = object.__new__(_Judge)
    judge.cfg = ChaosConfig()
    judge.run = SimpleNamespace(cfg=judge.cfg,
                                kills=[(100, 1), (200, 2), (300, 3), (400, 4)])
    judge.died_in_claim = 1
    judge.events = [{"t": 50, "pid": 2, "ev": "start"},
                    {"t": 150, "pid": 3, "ev": "start"},
                    {"t": 250, "pid": 3, "ev": "claim", "job": "x"},
                    {"t": 350, "pid": 4, "ev": "idle"},
                    {"t": 500, "pid": 1, "ev": "start"}]   # a log after the kill
    # pid 1 had not started, pid 3 held a job; pids 2 and 4 were between jobs
    assert judge._unlogged_claims() == 1 + 2


def test_queue_that_never_hands_out_a_job_earns_no_chaos_point(tmp_path,
                                                              redis_url):
    """Its fault quota cannot be met: no chaos check passes (it used to get 4)."""
    shutil.copy(QUEUES / "mini_correct.py", tmp_path)
    path = tmp_path / "myqueue.py"
    path.write_text("import sys\nfrom pathlib import Path\n\n"
                    "sys.path.insert(0, str(Path(__file__).parent))\n"
                    "from mini_correct import *\n\n\n"
                    "def claim(r, lease_s):\n    return None\n")
    args = claim_ack_reap.chaos_args(1, True) + ["--quota-cap-s", "2",
                                                 "--lease-s", "0.3"]
    report = queue_runs.chaos(str(path), redis_url, args, 60)
    assert report["stats"]["quota_short"], report.get("reason")
    by = _chaos_grades(report)
    assert sum(o.points for o in by.values()) == 0, by
    for name, o in by.items():
        assert not o.ok
        if name != "chaos_nothing_lost":      # lost jobs are real evidence
            assert "could not judge this (never a pass): too few faults" in o.message


HEARTBEAT = '''
import _thread, threading, time


def _spin():
    while True:
        time.sleep(0.05)


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    {hide}
    stop, finished, lost = threading.Event(), threading.Event(), []

    def beat():
        while not finished.wait(lease_s / 3):
            if not queue.extend(r, job_id, attempt, lease_s):
                lost.append(True)
                stop.set()
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    return not lost and bool(queue.extend(r, job_id, attempt, lease_s))
'''


@pytest.mark.parametrize("hide, left", [("pass", 0),
                                        ("_thread.start_new_thread(_spin, ())", 1)])
def test_threads_left_are_counted_from_outside_the_host(tmp_path, redis_url, hide,
                                                        left):
    """A thread made with _thread is invisible to threading.enumerate(), not to
    the kernel: counted in /proc from the harness, it costs the check."""
    path = tmp_path / "heartbeat.py"
    path.write_text(HEARTBEAT.format(hide=hide))
    env = queue_runs.learner_env(str(path), redis_url, heartbeats.IMPORTS)
    q = remote_module.load(str(path), json.loads(env[remote_module.ENV]))
    try:
        stops = heartbeat_trial._stops(q, connect(redis_url))
    finally:
        q.close()
        sandbox.cleanup(tmp_path)
    assert stops["error"] == "" and stops["held"] is False, stops
    assert stops["threads_left"] == left, stops
    # Judged on the count alone (how soon it stopped has checks of its own).
    stops["elapsed"] = min(stops["elapsed"], heartbeat_trial.LEASE_S)
    check = heartbeats._trial_outcomes({"stops": stops})[0]
    assert check.name == "stops_when_lease_lost" and check.ok is (left == 0)
    if left:
        assert "thread was still running" in check.message


def test_replay_copy_never_follows_a_link(tmp_path, monkeypatch):
    """replay-<module>.py beside the notebook is the learner's: a link there, a
    hard link to a file elsewhere or a FIFO is refused with a message, never
    written (nor waited on)."""
    judged, folder, elsewhere = (tmp_path / d for d in ("judged", "a2", "grader"))
    for d in (judged, folder, elsewhere):
        d.mkdir()
    (judged / "myqueue.py").write_text("# the judged queue\n")
    target = elsewhere / "gradebook.csv"
    monkeypatch.chdir(tmp_path)
    cmd = "python -m handson.chaos 4 --queue myqueue.py --seed 1"
    replay = folder / "replay-myqueue.py"
    for stage in (os.symlink, os.link, lambda t, path: os.mkfifo(path)):
        target.write_text("ada,24\n")
        replay.unlink(missing_ok=True)
        stage(target, replay)
        problems: list[str] = []
        out = replayable(cmd, claim_ack_reap, judged, folder / "nb.ipynb", problems)
        assert out == cmd and target.read_text() == "ada,24\n"
        assert len(problems) == 1 and "replay-myqueue.py was not written" in problems[0]
    replay.unlink()
    out = replayable(cmd, claim_ack_reap, judged, folder / "nb.ipynb", [])
    assert "--queue a2/replay-myqueue.py " in out
    assert replay.read_text() == "# the judged queue\n"
    replay.unlink()                  # a judged module that is a link: not copied
    (judged / "myqueue.py").unlink()
    (judged / "myqueue.py").symlink_to(target)
    assert replayable(cmd, claim_ack_reap, judged, folder / "nb.ipynb", []) == cmd
    assert not replay.exists()


ESCAPE = textwrap.dedent('''
    import os
    here = os.path.dirname(os.path.realpath(__file__))
    open(os.path.join(here, "written-by-the-learner"), "w").write("x")
''')


def test_a_module_linked_out_of_its_folder_opens_no_other_folder(tmp_path,
                                                                  redis_url):
    """The host's writable dir is the module's folder as named, not the link's
    target; and the grader does not judge a module linked from elsewhere."""
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    (other / "real.py").write_text(ESCAPE)
    link = work / "myqueue.py"
    link.symlink_to(other / "real.py")
    probe = queue_runs.probe(str(link))
    sandbox.cleanup(work)
    assert not probe["ok"] and "written-by-the-learner" in probe["error"], probe
    ev = claim_ack_reap.CELLS.evaluate(work, redis_url, True)
    assert sum(o.points for o in ev.outcomes) == 0
    assert ev.problems == ["myqueue.py is a link to a file outside its folder: the "
                           "grader judges only a module file that is really there"]
    assert sorted(p.name for p in other.iterdir()) == ["real.py"]


SPY = '''
import os
import time

SEEN = sorted(os.environ)           # at import, before any call


def seen():
    return SEEN


def now():
    return time.time()
'''


def test_the_host_environment_does_not_give_the_grader_away(tmp_path, redis_url,
                                                             monkeypatch):
    """Under the grader the learner's module sees the variables any confined
    process gets; the host's settings (the clock skew here) came on its pipe."""
    monkeypatch.setenv("EO_CLOCK_SKEW_S", "3600")
    monkeypatch.delenv("QUEUE_MAX", raising=False)
    path = tmp_path / "spy.py"
    path.write_text(SPY)
    env = queue_runs.learner_env(str(path), redis_url)
    q = remote_module.load(str(path), json.loads(env[remote_module.ENV]))
    try:
        seen, skewed = q.seen(), q.now() - time.time()
    finally:
        q.close()
        sandbox.cleanup(tmp_path)
    assert seen == ["HOME", "LANG", "PATH", "PYTHONPATH", "REDIS_URL", "TMPDIR"]
    assert 3500 < skewed < 3700


STATS_THREAD = '''

def _report_stats():          # a learner's stats thread: not a daemon
    import time
    while True:
        time.sleep(5)


import threading  # noqa: E402
threading.Thread(target=_report_stats).start()
'''


def test_a_claim_killed_between_its_trips_dies_in_the_learner_s_process_too(
        tmp_path, redis_url):
    """The kill test SIGKILLs a claimer with its host: a thread of the
    learner's that kept the host alive let the claim finish its second round
    trip after its caller was dead, and the job was never lost."""
    for name in ("mini_correct", "claim_two_trips"):
        shutil.copy(QUEUES / f"{name}.py", tmp_path / f"{name}.py")
    module = tmp_path / "claim_two_trips.py"
    module.write_text(module.read_text() + STATS_THREAD)
    res, _ = _claim_kill_check(module, redis_url)
    assert not res["ok"] and "jobs were gone" in res["got"], res


def _claim_kill_check(module: Path, redis_url: str) -> tuple[dict, list]:
    """claim_atomic_concurrent on `module`, sandboxed as the grader runs it."""
    try:
        found, left = queue_runs.contract(str(module), redis_url,
                                          ["claim_atomic_concurrent"], 150)
    finally:
        sandbox.cleanup(module.parent)
    return found["claim_atomic_concurrent"], left


DIES_AFTER_A_KILL = '''

import glob  # noqa: E402

# Each process that imports this marks it (a host's PID is 1 or 2 in a
# namespace of its own): the check's host and the first claimer's claim, and
# a third process, and each after it, ends itself at its first claim.
_HERE = os.path.dirname(os.path.abspath(__file__))
_BEFORE = len(glob.glob(os.path.join(_HERE, "host-*")))
open(os.path.join(_HERE, f"host-{uuid.uuid4().hex}"), "w").close()
_reference_claim = claim


def claim(r, lease_s):
    if _BEFORE >= 2:
        os._exit(3)
    return _reference_claim(r, lease_s)
'''


def test_a_claimer_host_that_dies_by_itself_is_not_restarted_without_end(
        tmp_path, redis_url):
    """Under the grader the kill test restarts a claimer's host only for a
    kill it made: a host that ends itself at each claim is a worker that
    crashed, so the check says no claimer got going instead of starting one
    host after another until its limit."""
    shutil.copy(QUEUES / "mini_correct.py", tmp_path / "mini_correct.py")
    module = tmp_path / "dies.py"
    module.write_text((QUEUES / "mini_correct.py").read_text() + DIES_AFTER_A_KILL)
    res, left = _claim_kill_check(module, redis_url)
    assert not res["ok"] and "1 of 24 SIGKILLs landed" in res["got"], res
    hosts = list(tmp_path.glob("host-*"))
    # the check's, the killed one, the next (one more if the kill came
    # between two claims: its next claim starts a host, unasked)
    assert 3 <= len(hosts) <= 4, hosts
    assert not left


def test_a_hole_the_contract_checks_showed_fails_its_chaos_check_every_time():
    """A chaos run that happened to miss a hole a contract check broke outright
    earns nothing for that invariant, so two gradings of one notebook agree;
    holes no check showed, and checks that passed, change nothing."""
    clean = {"verdict": "pass", "seed": 1, "stats": {},
             "invariants": {i: {"ok": True, "count": 0}
                            for names in claim_ack_reap.INVARIANTS.values()
                            for i in names}}
    results = {"killed_between_replies": {"ok": False, "witnessed": ["lost"]},
               "claim_atomic_concurrent": {"ok": True, "witnessed": []},
               "bound_refuses": {"ok": False, "witnessed": []}}
    outcomes, _, _ = claim_ack_reap._chaos_outcomes([clean], "myqueue.py", "x")
    claim_ack_reap._missed_known_holes(outcomes, results)
    by = {o.name: o for o in outcomes}
    assert by["chaos_nothing_lost"].points == 0
    assert "killed_between_replies" in by["chaos_nothing_lost"].message
    assert all(by[n].ok for n in by if n != "chaos_nothing_lost"), by
    results["poison_to_dlq_with_reason"] = {"ok": False,
                                            "witnessed": ["over_delivered"]}
    claim_ack_reap._missed_known_holes(outcomes, results)
    assert not by["chaos_dead_have_reasons"].ok and by["chaos_applied_once"].ok
