"""The benchmark end to end at a tiny size: the reference queue and the PING loop.

The peers (RQ, Celery, huey, dramatiq) are installed only by `make bench`, so
these tests run the part that needs none of them. No rate is asserted: a
benchmark's numbers belong in its report, not in a pass/fail test.
"""

import json
import os
import subprocess
import sys

import pytest

from handson.bench import run, systems


def test_slope_rate_ignores_start_up_and_stragglers():
    samples = [(0.0, 100), (1.0, 100), (2.0, 90), (3.0, 50), (4.0, 10), (9.0, 0)]
    assert run.slope_rate(samples, 100) == pytest.approx(40.0)


def test_slope_rate_refuses_a_queue_that_did_not_drain():
    with pytest.raises(run.BenchError, match="did not drain"):
        run.slope_rate([(0.0, 100), (1.0, 95)], 100)


def test_reference_and_ping_end_to_end():
    res = subprocess.run(
        [sys.executable, "-m", "handson.bench", "--size", "small", "--json",
         "--workers", "1", "--only", "reference", "reference-batched"],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    got = {(x["system"], x["workers"], x["placement"]) for x in report["results"]}
    assert got == {(s, w, p) for s in ("ping", "reference", "reference-batched")
                   for w in (1,) for p in ("together", "apart")}
    assert all(x["rate"] > 0 and len(x["rates"]) == 1 for x in report["results"])
    assert all(x["server_us_per_job"] > 0 for x in report["results"])
    goals = {g["goal"] for g in report["goals"]}
    assert "reference >= 90% of PING/2 per worker (1w, together)" in goals
    assert "batched > 50,000 jobs/s per worker (1w, apart)" in goals
    assert "ping, together, 1 worker(s)" in res.stderr      # progress is shown


def test_placement_pins_the_workers_and_the_server(redis_url, tmp_path):
    # The worker pins itself from BENCH_CPUS; the runner pins the server's threads.
    server_cpus, worker_cpus = run.cpus("apart")
    assert server_cpus.isdisjoint(worker_cpus)
    assert run.cpus("together")[0] == run.cpus("together")[1]
    proc = run._spawn(["rq-does-not-exist"], redis_url, str(tmp_path), "x",
                      worker_cpus)
    proc.wait(timeout=60)
    assert proc.returncode == 2          # unknown system: usage, exit 2
    code = ("import os; from handson.bench import worker; worker.main(['ping', '1']);"
            "print(sorted(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "BENCH_REDIS_URL": redis_url,
                              "BENCH_CPUS": ",".join(map(str, worker_cpus))})
    assert out.stdout.strip().splitlines()[-1] == str(sorted(worker_cpus))


def test_unknown_placement_is_one_clear_line():
    res = subprocess.run([sys.executable, "-m", "handson.bench", "--placement",
                          "sideways"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "invalid choice: 'sideways'" in res.stderr


def test_filled_reference_queue_holds_exactly_n_jobs(r, redis_url, monkeypatch):
    monkeypatch.setenv("BENCH_REDIS_URL", redis_url)
    ref = systems.SYSTEMS["reference"]
    ref.fill(r, 2500)
    assert ref.remaining(r) == 2500


def test_missing_peer_says_how_to_install(monkeypatch):
    fake = systems.System("x", None, None, None, needs="no_such_peer_package")
    assert "make bench" in fake.missing()
    assert systems.SYSTEMS["reference"].missing() is None


def test_table_marks_goals_met_or_short():
    results = [run.Result("ping", 1, 10, [20_000.0], [1.0]),
               run.Result("reference", 1, 10, [9_500.0], [30.0]),
               run.Result("rq", 1, 10, [500.0], [90.0]),
               run.Result("reference-batched", 1, 10, [40_000.0], [12.0])]
    report = {"results": [vars(x) | {"rate": x.rate, "per_worker": x.per_worker,
                                     "server_us_per_job": x.server_us_median}
                          for x in results],
              "skipped": {"celery": "celery is not installed"},
              "goals": run.goals(results)}
    text = run.table(report)
    assert "MET   reference >= 90% of PING/2 per worker (1w, unpinned): 95%" in text
    assert "MET   reference >= 10x RQ (1w, unpinned): 19.0x" in text
    assert "SHORT batched > 50,000 jobs/s per worker (1w, unpinned): 40,000" in text
    assert "celery             skipped: celery is not installed" in text


def test_goals_show_each_rounds_ratio_and_their_spread():
    """Repeated rounds: the ratio of each round alone, and how far they spread."""
    results = [run.Result("ping", 1, 10, [20_000.0, 10_000.0, 20_000.0], [1.0] * 3),
               run.Result("reference", 1, 10, [9_000.0, 5_000.0, 8_000.0],
                          [30.0] * 3),
               run.Result("rq", 1, 10, [900.0, 500.0, 1_000.0], [90.0] * 3)]
    goals = {g["goal"].split(" (")[0]: g for g in run.goals(results)}
    ping = goals["reference >= 90% of PING/2 per worker"]
    assert ping["rounds"] == [0.9, 1.0, 0.8]
    assert abs(ping["spread"] - 0.2 / 0.9) < 1e-9
    assert goals["reference >= 10x RQ"]["rounds"] == [10.0, 10.0, 8.0]
    report = {"results": [], "skipped": {}, "goals": run.goals(results)}
    assert "(rounds 0.9, 1, 0.8: spread 22%)" in run.table(report)
    one = run.goals([run.Result("ping", 1, 10, [2.0], [1.0]),
                     run.Result("reference", 1, 10, [1.0], [1.0])])
    assert "spread" not in one[0]
