"""The learner's own heartbeat cadence (issue 34, kind 6), timed for real.

The heartbeats corpus's modules run in this process against the trial's queue
that always grants: a beat at lease_s / 3 keeps the rule, one a lease apart
or one left beating after the call breaks it, every run (the trial's runs
again change nothing for them).
"""

import shutil

import pytest

from autograder.judges import heartbeat_trial as ht
from autograder.judges import heartbeats
from autograder.judges.corpus import ROOT

FOLDER = ROOT / "heartbeats"


def _cadence(tmp_path, name: str, redis_url: str) -> dict:
    shutil.copy(FOLDER / "correct.py", tmp_path / "correct.py")
    shutil.copy(FOLDER / f"{name}.py", tmp_path / "heartbeat.py")
    return ht.cadence(str(tmp_path / "heartbeat.py"), redis_url)


@pytest.mark.parametrize("name, words", [
    ("interval_equals_lease", "past half the 0.6 s lease"),
    ("thread_started_after_work", "extend was never called"),
    ("thread_never_joined", "the heartbeat outlived its job"),
])
def test_a_wrong_cadence_is_named_with_its_gaps(tmp_path, redis_url, name, words):
    got = _cadence(tmp_path, name, redis_url)
    assert words in ht.cadence_problem(got), got
    assert got["run"] == ht.CADENCE_RUNS
    check = heartbeats._cadence_outcome(heartbeats.TRIAL_CHECKS[1], got)
    assert check is not None and not check.ok and words in check.got
    assert "gaps from the call to each extend" in check.got


@pytest.mark.parametrize("name", ["correct", "alt_quarter_lease",
                                  "alt_fixed_schedule", "alt_work_in_thread"])
def test_a_beat_at_a_third_of_the_lease_keeps_the_rule(tmp_path, redis_url, name):
    got = _cadence(tmp_path, name, redis_url)
    assert ht.cadence_problem(got) == "", got
    assert got["beats"] >= 6 and got["after_return"] == got["threads_left"] == 0
    check = heartbeats._cadence_outcome(heartbeats.TRIAL_CHECKS[1], got)
    assert check is None


@pytest.mark.parametrize("url, want", [
    ("unix:///s/redis.sock", "unix:///s/redis.sock?db=1"),
    ("unix:///s/redis.sock?db=2", "unix:///s/redis.sock?db=10"),
    ("redis://u:p@127.0.0.1:6379/3", "redis://u:p@127.0.0.1:6379?db=11"),
])
def test_the_trial_never_shares_the_contract_checks_database(url, want):
    assert heartbeats.trial_url(url) == want

