"""Each Break It experiment at its small size: the failure, then the fix."""

import subprocess
import sys
from collections import Counter

from handson import breakit


def test_lease_shorter_than_job_duplicates_then_heartbeat(redis_url):
    exp = breakit.lease("small", url=redis_url)
    assert exp.broken.duplicates > 0
    assert exp.fixed.duplicates == 0
    assert exp.fixed.dead == []
    docs = breakit.SIZES["small"]["lease"]["docs"]
    assert exp.fixed.summary["naive_distinct"] == docs
    assert "nobody was killed" in exp.text()


def test_no_attempt_limit_loops_then_limit_buries(redis_url):
    exp = breakit.attempts("small", url=redis_url)
    poison = exp.facts["poison"]
    assert exp.broken.verdict == "unknown" and exp.broken.dlq == 0
    # it ends by looping, not by its time cap
    assert exp.broken.max_deliveries >= breakit.SIZES["small"]["attempts"][
        "loop_claims"]
    assert "never ended" in exp.broken.text
    # Once the good work is done the pool only fails: after the last good
    # job's claim, every poison job is claimed loop_claims times more (a limit
    # would have buried them), and poison's share of the claims has grown.
    claims, ids = exp.broken.claims, set(exp.facts["poison_ids"])
    assert len(ids) == poison
    last_good = max(i for i, (_, job) in enumerate(claims) if job not in ids)
    after = Counter(job for _, job in claims[last_good + 1:])
    assert set(after) == ids
    assert min(after.values()) >= breakit.SIZES["small"]["attempts"]["loop_claims"]
    share = exp.facts["share"]
    assert share[-1] > share[0]
    assert exp.fixed.verdict == "valid"
    assert exp.fixed.dlq == poison and exp.fixed.max_deliveries == 3


def test_ack_before_work_loses_silently(redis_url):
    exp = breakit.ack_before_work("small", url=redis_url)
    assert exp.broken.lost > 0
    assert exp.broken.dlq == 0
    assert exp.fixed.lost == 0 and exp.fixed.verdict == "valid"
    killed, poison = exp.facts["killed_mid_work"], exp.facts["poison_lost"]
    assert killed + poison == exp.broken.lost
    assert 0 <= killed <= exp.broken.kills       # each job lost mid-work needs a kill
    assert f"lost {killed} job(s) that were mid-work" in exp.text()
    assert f"({exp.broken.lost} lost in all)" in exp.text()


def test_unbounded_grows_bound_refuses(redis_url):
    exp = breakit.unbounded("small", url=redis_url)
    bound = breakit.SIZES["small"]["unbounded"]["bound"]
    assert exp.broken.refused == 0
    assert exp.broken.peak_pending > 2 * bound
    assert exp.broken.memory_growth > exp.fixed.memory_growth
    assert exp.fixed.refused > 0
    assert exp.fixed.peak_pending <= bound
    assert exp.fixed.last_age < exp.broken.last_age


def test_unknown_experiment_is_a_clear_error():
    res = subprocess.run([sys.executable, "-m", "handson.breakit", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "invalid choice: 'nope'" in res.stderr
