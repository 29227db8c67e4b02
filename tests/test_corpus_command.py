"""`python -m autograder corpus`, run once: every wrong queue in tests/corpus/queues
loses a check, every correct one (and the reference queue) scores full marks.

The wrong queues written for the interleaving and time-scale checks must be
caught by the check that names their bug, so a weaker check cannot hide behind
another that happens to fail.
"""

import os
import re
import subprocess
import sys

import pytest

from autograder import corpus

pytestmark = pytest.mark.timeout(600)

CAUGHT_BY = {
    "ack_check_then_act": "interleavings",
    "fail_check_then_act": "interleavings",
    "extend_check_then_act": "interleavings",
    "enqueue_client_exists": "interleavings",
    "claim_watch_gives_up": "interleavings",
    "reap_not_atomic": "interleavings",
    "reap_two_trips": "killed_between_replies",
    "enqueue_two_trips": "killed_between_replies",
    "attempts_second_trip": "killed_between_replies",
    "claim_two_trips": "killed_between_replies",
    "lease_whole_seconds": "lease_time_scales",
    "reap_grace_wrong_sign": "lease_time_scales",
    "reap_own_clock": "deadline_from_server_clock",
}
LINE = re.compile(r"^(mutant|correct)\s+(\S+)\s+(CAUGHT by (\S+?):|ESCAPED|FULL|LOST)")


def test_the_corpus_command_catches_every_mutant_and_passes_the_rest(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus"],
                         capture_output=True, text=True, env=env, timeout=590)
    rows = {m[2]: m for m in map(LINE.match, out.stdout.splitlines()) if m}
    names = {name for name, _, _ in corpus.queues(corpus.CORPUS)}
    assert set(rows) == names, out.stdout + out.stderr
    mutants = {n for n, m in rows.items() if m[1] == "mutant"}
    assert len(mutants) >= 17 and len(rows) - len(mutants) >= 5
    for name, m in rows.items():
        want = "CAUGHT" if name in mutants else "FULL"
        assert m[3].startswith(want), out.stdout
    for name, check in CAUGHT_BY.items():
        assert rows[name][4] == check, out.stdout
    assert f"catch rate: {len(mutants)}/{len(mutants)} mutants caught" in out.stdout
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_folder_that_is_not_one_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus",
                          str(tmp_path / "nowhere")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "is not a folder" in out.stderr
