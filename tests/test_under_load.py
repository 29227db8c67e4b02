"""The lab chapter's timing-sensitive runs, beside a CPU-bound process.

A learner builds the book on a laptop that is doing something else; the
chapter's claims (a heartbeat leaves no duplicate, a paused worker's lease runs
out and its ack is refused) must hold there too, not only on a quiet machine.
"""

import subprocess
import sys

import pytest

from handson import breakit
from handson.book import lease_timeline

HOG = "while True:\n    pass\n"


@pytest.fixture
def cpu_hog():
    """One busy process per core, for the length of the test."""
    import os

    hogs = [subprocess.Popen([sys.executable, "-c", HOG])
            for _ in range(os.cpu_count() or 1)]
    yield hogs
    for p in hogs:
        p.kill()
        p.wait()


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
