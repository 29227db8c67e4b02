"""The log on Redis Streams: real consumer processes, real SIGKILL."""

import subprocess
import sys

import pytest

from handson.queues import streams_log as log


def test_partition_is_stable_across_processes():
    keys = [f"doc-{i}" for i in range(50)]
    here = [log.partition_for(k, 3) for k in keys]
    code = ("from handson.queues.streams_log import partition_for as p; "
            f"print([p(k, 3) for k in {keys!r}])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    assert here == eval(there)
    assert set(here) == {0, 1, 2}


def test_commit_before_processing_skips_records_after_a_kill(redis_url, r):
    res = log.commit_demo(redis_url, "before")
    assert res["pending_at_restart"] == 0
    assert res["processed_before_kill"] == 13, res
    # the second batch (records 10-19) was committed, and 13-19 never processed
    assert res["skipped"] == 7, res
    assert res["replayed"] == 0, res
    assert res["distinct"] + res["skipped"] == res["produced"]


def test_commit_after_processing_replays_records_after_a_kill(redis_url, r):
    res = log.commit_demo(redis_url, "after")
    assert res["pending_at_restart"] == 10
    assert res["skipped"] == 0, res
    # records 10-12 were processed, not committed, and processed again
    assert res["replayed"] == 3, res
    assert res["distinct"] == res["produced"]


def test_per_key_order_holds_within_a_partition_and_not_across(redis_url, r):
    keyed = log.order_demo(redis_url, keyed=True)
    assert keyed["partitions_per_doc"] == 1
    assert keyed["late_per_key"] == 0 and keyed["out_of_order_in_partition"] == 0
    spread = log.order_demo(redis_url, keyed=False)
    assert spread["partitions_per_doc"] > 1
    assert spread["out_of_order_in_partition"] == 0
    assert spread["late_per_key"] > 0, spread


def test_a_slow_record_blocks_its_partition_but_not_the_job_queue(redis_url, r):
    rows = {x["system"]: x for x in log.slow_record_demo(redis_url, slow_s=0.6)}
    assert rows["log"]["records"] == rows["queue"]["records"] == 30
    assert rows["log"]["normal_after_slow"] == rows["log"]["behind_slow_in_partition"]
    assert rows["log"]["normal_after_slow"] > 0
    assert rows["queue"]["normal_after_slow"] == 0


def test_lag_counts_pending_and_undelivered_per_partition(r):
    rows = log.lag_demo(r)
    assert sum(x["length"] for x in rows) == 30
    assert rows[0]["lag"] == 0
    assert rows[1]["pending"] == 3 and rows[1]["lag"] == rows[1]["length"]
    assert rows[2]["last_delivered"] == "0-0" and rows[2]["lag"] == rows[2]["length"]


def test_two_groups_read_independently_and_one_replays(r):
    a, b, c = log.readers_demo(r, records=20, replay_from=5)
    assert (a["read"], a["summarizer_lag"], a["indexer_lag"]) == (20, 0, 20)
    assert (b["read"], b["summarizer_lag"], b["indexer_lag"]) == (10, 0, 10)
    assert (c["read"], c["first_seq"], c["indexer_lag"]) == (15, 5, 10)


def test_bad_commit_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="commit must be"):
        log.consume("unix:///nowhere", "t", 0, "g", "c", tmp_path / "o",
                    commit="sometimes")
