"""The lab chapter's timing-sensitive runs, beside a CPU-bound process.

A learner builds the book on a laptop that is doing something else; the
chapters' claims (a heartbeat leaves no duplicate, a paused worker's lease runs
out and its ack is refused, a slow record holds up its partition and nothing
in the job queue) must hold there too, not only on a quiet machine.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import handson.q
from handson import breakit
from handson.book import lease_timeline
from handson.queues import streams_log
from handson.queues.checks import run_checks


def test_heartbeat_leaves_no_duplicate_beside_a_hog(cpu_hog, redis_url):
    exp = breakit.lease("small", url=redis_url)
    assert all(p.poll() is None for p in cpu_hog), "the hogs ran throughout"
    assert exp.broken.duplicates > 0, exp.text()
    assert exp.fixed.duplicates == 0 and exp.fixed.dead == [], exp.text()


def test_zombie_is_refused_beside_a_hog(cpu_hog, redis_url):
    rec = lease_timeline.record(redis_url)
    runs = lease_timeline.attempts(rec)
    first = runs[rec["zombie"]]
    last = min((x for a, x in runs.items() if a > rec["zombie"]),
               key=lambda x: x["claim"])
    effects = sum(1 for e in rec["events"] if e["ev"] == "commit" and e.get("effect"))
    assert all(p.poll() is None for p in cpu_hog), "the hogs ran throughout"
    assert first["silence"] > rec["lease_s"], runs
    assert last["claim"] < first["end"], runs
    assert effects == 1, rec["events"]


def test_a_slow_record_holds_up_its_partition_alone_beside_a_hog(cpu_hog,
                                                                   redis_url):
    """Measured with 0.6 s of slow work, the other partitions once finished
    after it on a loaded machine: what waits must be what sits behind it."""
    log_row, queue_row = streams_log.slow_record_demo(redis_url, slow_s=0.6)
    assert all(p.poll() is None for p in cpu_hog), "the hogs ran throughout"
    assert (log_row["normal_after_slow"] == log_row["behind_slow_in_partition"]
            > 0), log_row
    assert queue_row["normal_after_slow"] == 0, queue_row


def _pinned_hog(busy_s: float, idle_s: float) -> subprocess.Popen:
    """A process on CPU 0 alone, busy `busy_s` then asleep `idle_s`, for 60 s,
    at the highest priority it may take (a thread at SCHED_IDLE beside it on
    CPU 0 still got a slice now and then beside a hog at nice 0)."""
    code = ("import os, time\nos.sched_setaffinity(0, {0})\n"
            "try:\n    os.nice(-20)\nexcept OSError:\n    pass\n"
            "end = time.monotonic() + 60\nwhile time.monotonic() < end:\n"
            f"    t = time.monotonic() + {busy_s}\n"
            "    while time.monotonic() < t:\n        pass\n"
            f"    time.sleep({idle_s})\n")
    return subprocess.Popen([sys.executable, "-c", code])


WAITS = """
import json, os, signal, subprocess, time
from handson.infra.schedstat import Waits, thread_ns
os.sched_setaffinity(0, {0})
# Read at each edge (a sampler thread on this CPU, beside the hog, may come
# by only after the stop, and then hand the spinning's waits to it too).
with Waits(tick=60) as waits:
    a = time.monotonic()
    waits.sample(a)
    while time.monotonic() < a + 0.6:
        pass
    b = time.monotonic()
    waits.sample(b)
    subprocess.Popen(["sh", "-c", f"sleep 0.6; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    c = time.monotonic()
    waits.sample(c)
print(json.dumps({"spinning": waits.between(a, b), "stopped": waits.between(b, c),
                  "stop_s": c - b,
                  "counted": thread_ns(os.getpid()) is not None}))
"""


def test_the_kernel_counts_a_cpu_taken_but_not_a_process_stopped():
    """What excuses a late heartbeat: a thread runnable beside a busy process on
    its CPU waits, by the kernel's count; a stopped one does not."""
    hog = _pinned_hog(60, 0)
    try:
        out = subprocess.run([sys.executable, "-c", WAITS], capture_output=True,
                             text=True, timeout=60, check=True)
    finally:
        hog.kill()
        hog.wait()
    got = json.loads(out.stdout)
    assert got["counted"], got
    assert got["spinning"] > 0.15, got          # about half of the 0.6 s
    # The window holds the stop (0.6 s) and the runnable time around it (its
    # Popen, its wake-up beside the hog), which a loaded machine stretches: a
    # count that took in the stop would be the whole window. Loaded CI runs
    # counted 0.14 s of a 0.8 s window and 0.47 s of a 1.08 s one.
    assert got["stop_s"] > 0.55 and got["stopped"] < got["stop_s"] - 0.45, got


HELD = Path(handson.q.__file__).read_text().replace(
    "def extend(", "def _extend_now(", 1) + """

import os, threading
_thread = threading.local()


def extend(r, job_id, attempt, lease_s, *, queue="q"):
    _thread.calls = getattr(_thread, "calls", 0) + 1
    if _thread.calls == 4:              # each beating thread, after 3 beats
        os.sched_setaffinity(0, {0})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return _extend_now(r, job_id, attempt, lease_s, queue=queue)
"""


@pytest.mark.parametrize("host", [None, "[]"], ids=["in-process", "own-process"])
def test_a_correct_heartbeat_keeps_its_point_on_a_machine_that_holds_it(
        tmp_path, redis_url, monkeypatch, host):
    """The reference queue, its beating thread (after three beats) at the
    lowest priority on a CPU that a process holds 1.5 s in every 2.3 s: the
    beats come late while the reaper runs on, as on a loaded machine. The
    point is kept, whichever trial is judged, also when extend runs in a host
    process of its own, as under the grader."""
    if host is not None:
        monkeypatch.setenv("EO_LEARNER_PREFIX", host)
    path = tmp_path / "held.py"
    path.write_text(HELD)
    # A thread at the lowest priority that wakes from a sleep still got a
    # slice soon enough now and then beside a hog at nice 0 (a fresh-clone CI
    # run saw no hold in ten runs); beside one at nice -20 each of eight runs
    # here showed one. Where the hog may not raise its priority, run again, up
    # to ten runs, until one shows it.
    for _ in range(10):
        hog = _pinned_hog(1.5, 0.8)
        try:
            [res] = run_checks(str(path), redis_url, ["heartbeat_keeps_lease"])
        finally:
            hog.kill()
            hog.wait()
        assert res.ok, res.got
        if "before it set aside" in res.got or "not judged" in res.got:
            break
    assert "before it set aside" in res.got or "not judged" in res.got, res.got
