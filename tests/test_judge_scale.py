"""The chaos judge's per-job invariants cost the number of claims, not its
square, and say what the plain pairwise reading of their definitions says.

A poison job that loops is claimed thousands of times: judged pair by pair, a
run's verdict took longer than the run (a grade spun for its whole limit). The
references below are those pairwise readings, kept here to hold the fast ones
to them on random histories.
"""

import json
import random
import time
import types
from collections import defaultdict

from handson.faults import judge as judge_mod
from handson.faults.config import ChaosConfig
from handson.faults.server_clock import ServerClock

LEASE_NS = 1_000_000_000


def _judge(tmp_path, events: list[dict], kills: list[tuple[int, int]]):
    logs = tmp_path / "events"
    logs.mkdir(parents=True, exist_ok=True)
    by_pid = defaultdict(list)
    for e in events:
        by_pid[e["pid"]].append(e)
    for pid, evs in by_pid.items():
        (logs / f"{pid}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    clock = ServerClock()
    cfg = ChaosConfig(queue="q", lease_s=LEASE_NS / 1e9)
    run = types.SimpleNamespace(cfg=cfg, kills=kills, events_dir=logs,
                                server_clock=clock)
    ids = sorted({e["job"] for e in events if "job" in e})
    return judge_mod._Judge(run, ids, (0, 0), [], 0, ([], {}))


def _stale_pairwise(j, kinds):
    out = []
    for job, evs in j.by_job.items():
        claimed = []
        for e in evs:
            if e["ev"] == "claim":
                claimed.append((e["t"], e["attempt"]))
            elif e["ev"] in kinds and e.get("ok", True):
                t_sent = e.get("t0", e["t"])
                if any(t < t_sent and a > e["attempt"] for t, a in claimed):
                    if job not in out:
                        out.append(job)
    return out


def _handed_twice_pairwise(j):
    lease_ns, margin = j.cfg.lease_s * 1e9, 0.02e9
    died = j.deaths()
    out = []
    for job, evs in j.by_job.items():
        claims = [e for e in evs if e["ev"] == "claim"]
        fails = any(e["ev"] == "fail" for e in evs)
        for i, b in enumerate(claims):
            for a in claims[:i]:
                if a["attempt"] >= b["attempt"] or a["pid"] == b["pid"]:
                    continue
                mine = [e for e in evs if e["pid"] == a["pid"]
                        and e.get("attempt") == a["attempt"]]
                if any(e["ev"] == "ack" and e["t"] < b.get("t0", b["t"])
                       for e in mine):
                    out.append(job)
                    break
                start = a.get("t0", a["t"])
                if b["t"] >= start + lease_ns - margin:
                    continue
                if any(e["ev"] == "fail" and e.get("t0", e["t"]) < b["t"]
                       for e in mine):
                    continue
                if fails and any(a["t"] <= t <= b["t"] for t in died[a["pid"]]):
                    continue
                out.append(job)
                break
            if job in out:
                break
    return out


def _history(rng: random.Random, job: str, t: int) -> tuple[list[dict], list]:
    """Claims of one job by random workers, some acked, some failed, some of
    their workers killed; gaps around a lease, so both sides of it show."""
    events, kills = [], []
    for attempt in range(1, rng.randint(2, 7)):
        pid = rng.randint(1, 4)
        t += rng.choice([50, 300, 900, 1100, 2500]) * 1_000_000
        events.append({"ev": "claim", "job": job, "attempt": attempt, "pid": pid,
                       "t0": t - 2_000_000, "t": t})
        after = t + rng.randint(1, 400) * 1_000_000
        roll = rng.random()
        if roll < 0.3:
            events.append({"ev": "ack", "job": job, "attempt": attempt,
                           "pid": pid, "t0": after - 1_000_000, "t": after})
        elif roll < 0.5:
            events.append({"ev": "fail", "job": job, "attempt": attempt,
                           "pid": pid, "t0": after - 1_000_000, "t": after})
        elif roll < 0.6:
            kills.append((after, pid))
        elif roll < 0.7:
            events.append({"ev": "crash_point", "pid": pid, "t": after})
    return events, kills


def test_fast_invariants_agree_with_their_pairwise_reading(tmp_path):
    rng = random.Random(7)
    for case in range(40):
        events, kills = [], []
        for n in range(6):
            evs, ks = _history(rng, f"job-{n}", rng.randint(0, 3) * 10**9)
            events += evs
            kills += ks
        j = _judge(tmp_path / str(case), events, kills)
        assert sorted(j._handed_twice()) == sorted(_handed_twice_pairwise(j)), case
        for kinds in (("ack", "fail"), ("extend",)):
            assert sorted(j._stale(kinds)) == sorted(_stale_pairwise(j, kinds)), case


def test_a_job_claimed_thousands_of_times_is_judged_in_a_moment(tmp_path):
    """20,000 claims of one poison job, each failed back at once by the next of
    four workers: the pairwise reading made 200 million comparisons of it."""
    events, t = [], 0
    for attempt in range(1, 20_001):
        t += 200_000                    # a claim every 0.2 ms: well inside a lease
        pid = attempt % 4
        events.append({"ev": "claim", "job": "doc-7", "attempt": attempt,
                       "pid": pid, "t0": t - 50_000, "t": t})
        events.append({"ev": "fail", "job": "doc-7", "attempt": attempt,
                       "pid": pid, "ok": True, "t0": t + 50_000, "t": t + 100_000})
    j = _judge(tmp_path, events, [])
    start = time.process_time()
    assert j._handed_twice() == []
    assert j._stale(("ack", "fail")) == []
    assert time.process_time() - start < 5
