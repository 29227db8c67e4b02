"""`check` tells a learner each verdict as it comes, and stops what cannot help.

A claim that hands out attempt 0 fails the gate's second check; `check` prints
that line while the other checks still run, and stops its chaos run, which a
queue this wrong could not drain (it ran its 150 s out before this).
"""

import subprocess
import sys
import threading

import nbformat

from autograder.isolation import sandbox
from autograder.notebooks import notebook

COUNTED = "redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)"
NEVER_COUNTED = "redis.call('HSETNX', KEYS[3] .. id, 'attempts', 1)"


def _wrong_claim(tmp_path):
    nb = nbformat.read(notebook.source_notebook("claim_ack_reap"), as_version=4)
    edited = [c for c in nb.cells if COUNTED in c.source]
    assert len(edited) == 1, "the reference's claim counts its attempt here"
    edited[0].source = edited[0].source.replace(COUNTED, NEVER_COUNTED)
    path = tmp_path / "claim_ack_reap.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_wrong_claim_is_told_first_and_the_chaos_run_is_stopped(tmp_path):
    done = subprocess.run([sys.executable, "-m", "autograder", "check",
                           str(_wrong_claim(tmp_path))], cwd=notebook.REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    heard = [line.split(None, 4)[3:] for line in done.stderr.splitlines()
             if "  FAIL  " in line or "  PASS  " in line]
    assert heard[:2] == [["PASS", "enqueue_idempotent"],
                         ["FAIL", "claim_returns_payload_and_attempt: attempt 0"]]
    assert len(heard) == 16, "every contract check was told as it came"
    assert "the quick check stopped the chaos run" in done.stdout


def test_a_run_s_lines_are_heard_as_written_and_stop_ends_it(tmp_path):
    stop, heard = threading.Event(), []

    def hear(line):
        heard.append(line)
        stop.set()
    code = "import time\nprint('first', flush=True)\ntime.sleep(120)\nprint('never')"
    fin = sandbox.run([sys.executable, "-c", code], timeout=300, on_line=hear,
                      stop=stop)
    assert heard == ["first"] and fin.stdout == "first\n"
    assert fin.supervisor_killed == "its caller stopped it"
