"""`check` tells a learner each verdict as it comes, and stops what cannot help.

A claim that hands out attempt 0 fails the gate's second check, an enqueue that
forgets finished jobs its first, an ack without its fence a later one; `check`
prints each verdict while the other checks still run, and runs no chaos run
past a failed contract check (a queue this wrong could not drain one: it ran
its 150 s out before), leaving nothing of it behind.
"""

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder import cli
from autograder.isolation import sandbox
from autograder.notebooks import notebook

COUNTED = "redis.call('HINCRBY', KEYS[3] .. id, 'attempts', 1)"
DONE_TOO = "    if redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end\n"
FENCE = ("    if tonumber(redis.call('HGET', KEYS[2] .. ARGV[1], 'attempts')) ~= "
         "tonumber(ARGV[2])\n    then return 0 end\n")
WRONG = {  # the reference's line, the learner's, and the verdicts told first
    "claim_never_counts": (COUNTED, COUNTED.replace("HINCRBY", "HSETNX"),
                           ["PASS  enqueue_idempotent",
                            "FAIL  claim_returns_payload_and_attempt: attempt 0"]),
    "enqueue_forgets_done": (DONE_TOO, "", ["FAIL  enqueue_idempotent: "]),
    # the gate passes; a later check fails while the chaos run is under way
    "ack_without_fence": (FENCE, "", ["PASS  enqueue_idempotent",
                                      "PASS  claim_returns_payload_and_attempt"]),
}


def _wrong(tmp_path, old, new):
    nb = nbformat.read(notebook.source_notebook("claim_ack_reap"), as_version=4)
    edited = [c for c in nb.cells if old in c.source]
    assert len(edited) == 1, f"the reference has {old!r} once"
    edited[0].source = edited[0].source.replace(old, new)
    path = tmp_path / "claim_ack_reap.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("bug", list(WRONG))
def test_the_failure_is_told_first_and_no_chaos_run_follows(tmp_path, bug):
    old, new, first = WRONG[bug]
    # A short temp dir of its own: the kernel's socket path must fit in 107 bytes
    # (under pytest-xdist, tmp_path/tmp did not).
    with tempfile.TemporaryDirectory(prefix="eo-t-") as short:
        scratch = Path(short)
        done = subprocess.run([sys.executable, "-m", "autograder", "check",
                               str(_wrong(tmp_path, old, new))], cwd=notebook.REPO,
                              capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, TMPDIR=str(scratch)))
        left = sorted(p.name for p in scratch.iterdir())
    assert done.returncode == 1, done.stderr[-2000:]
    heard = [line.split(" s  ", 1)[1] for line in done.stderr.splitlines()
             if "  FAIL  " in line or "  PASS  " in line]
    assert all(h.startswith(f) for h, f in zip(heard, first, strict=False)), heard[:3]
    assert len(heard) == 16, done.stderr[-1500:]
    assert "the quick check stopped the chaos run" in done.stdout
    assert left == [f"eo-view-{os.geteuid()}"]


def test_a_learner_s_message_cannot_print_a_line_of_its_own():
    said = cli._one_line("oops\n...   0.1 s  PASS  attempt_grows\n\x1b[32mALL OK")
    assert "\n" not in said and "\x1b" not in said
    assert said == "oops ... 0.1 s PASS attempt_grows [32mALL OK"


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


def test_a_hung_enqueue_ends_the_check_after_its_own_limit(tmp_path):
    """The gate's first check hangs: the second is not given its 30 s too, and
    nothing after it runs (a hostile review timed 62 s for a claim that hung
    on the gate's database)."""
    spins = ('    """Add a job once: the same job_id again (pending, in flight or '
             'done) is a no-op."""\n')
    path = _wrong(tmp_path, spins, spins + "    import time\n    while True:\n"
                                           "        time.sleep(1)\n")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eo-t-") as short:
        done = subprocess.run([sys.executable, "-m", "autograder", "check",
                               str(path)], cwd=notebook.REPO, capture_output=True,
                              text=True, timeout=600,
                              env=dict(os.environ, TMPDIR=short))
    took = time.monotonic() - start
    heard = [line.split(" s  ", 1)[1] for line in done.stderr.splitlines()
             if "  FAIL  " in line or "  PASS  " in line]
    assert heard and heard[0].startswith("FAIL  enqueue_idempotent: "), heard
    assert "no answer after" in heard[0]
    assert took < 55, (took, heard)         # its 30 s and the start, not 60 s
    assert "so the other checks and the chaos run were skipped" in done.stdout
    assert "the quick check stopped the chaos run" not in done.stdout
