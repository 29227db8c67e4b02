"""A learner's own load excuses nothing; the machine's load still does.

A heartbeat that never renews once scored full marks on `long_jobs_run_once`
by forking processes that burn CPU while its jobs ran: the kernel then counted
the workers waiting for a CPU (the trial was excused), or the judge's reaper
was starved. Graded for real here, as a submitted notebook: the spinners share
the run's capped, low-weight cgroup, and the load they make is theirs. A
correct heartbeat keeps its marks beside a CPU hog the test starts itself.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat

from autograder.notebooks import notebook
from handson.infra import remote_module

ROOT = notebook.REPO
ENV = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep
           + os.environ.get("PATH", ""))
ENV.pop("REDIS_URL", None)
ENV.pop(remote_module.ENV, None)

SPINNING = '''%%writefile heartbeat.py
"""Never renews; keeps every CPU it can busy while the work runs."""
import os
import signal
import threading

from handson.q import INFLIGHT, JOBS  # noqa: F401
from handson.q import ack, claim, dead, enqueue, fail, reap  # noqa: F401


def extend(r, job_id, attempt, lease_s):
    return True


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    spinners = []
    for _ in range(2 * (os.cpu_count() or 1)):
        pid = os.fork()
        if pid == 0:
            while True:
                pass
        spinners.append(pid)
    try:
        work(threading.Event())
    finally:
        for pid in spinners:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return True
'''


def _grade(tmp_path: Path, module_cell: str | None = None) -> dict:
    nb = nbformat.read(str(notebook.source_notebook("heartbeats")), 4)
    if module_cell is not None:
        cell = next(c for c in nb.cells if c.cell_type == "code"
                    and c.source.startswith("%%writefile heartbeat.py"))
        cell.source = module_cell
    path = tmp_path / "heartbeats" / "heartbeats.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    res = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path),
                          "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=ENV)
    assert res.stdout, res.stderr[-2000:]
    return {c["name"]: c for c in json.loads(res.stdout)["checks"]}


def test_a_heartbeat_that_never_renews_loses_long_jobs_beside_its_spinners(
        tmp_path):
    checks = _grade(tmp_path, SPINNING)
    long_jobs = checks["long_jobs_run_once"]
    assert not long_jobs["ok"] and long_jobs["points"] == 0, long_jobs
    assert "not judged" not in json.dumps(long_jobs), long_jobs


def test_a_correct_heartbeat_keeps_full_marks_beside_a_cpu_hog(tmp_path, cpu_hog):
    checks = _grade(tmp_path)
    assert all(p.poll() is None for p in cpu_hog), "the hogs ran throughout"
    lost = {n: c for n, c in checks.items() if not c["ok"]}
    assert not lost, lost
