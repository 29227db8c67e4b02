"""The queue on a real Redis Cluster: start and stop, contract, chaos, failover."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from test_redis_server import _as_in_a_terminal

from handson import cluster_runs, q
from handson.cluster import EmbeddedCluster, cluster_client
from handson.faults.engine import ChaosConfig
from handson.faults.engine import run as chaos_run
from handson.queues.checks import run_checks
from handson.redis_server import EmbeddedRedis, RedisUnavailable, connect

ROOT = Path(__file__).resolve().parents[1]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    return all(_gone(p) for p in pids)


@pytest.fixture(scope="module")
def cluster():
    c = EmbeddedCluster(3).start()
    yield c
    c.stop()
    assert _wait_gone(c.pids())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["int", "kill"])
def test_cli_cluster_comes_up_and_leaves_nothing_running(sig):
    """Ctrl-C stops every node cleanly; a SIGKILLed parent takes them with it."""
    p = subprocess.Popen([sys.executable, "-m", "handson.cluster", "--primaries", "1"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True,
                         preexec_fn=_as_in_a_terminal)
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C"):
                break
        out = "".join(lines)
        assert "export REDIS_CLUSTER_URL=redis://127.0.0.1:" in out, (out, p.stderr)
        pids = [int(x) for x in re.findall(r"pid (\d+)", out)]
        assert len(pids) == 2 and not any(_gone(x) for x in pids)
        url = out.split("export REDIS_CLUSTER_URL=")[1].split()[0]
        rc = cluster_client(url)
        assert int(rc.cluster_info()["cluster_slots_ok"]) == 16384
        rc.close()
        os.killpg(p.pid, sig)
        p.wait(15)
        assert _wait_gone(pids), f"redis-server outlived its parent ({sig.name})"
        if sig == signal.SIGINT:
            assert p.returncode == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_connect_follows_the_url_and_queues_spread_over_shards(cluster):
    rc = connect(cluster.url, decode_responses=True)
    assert isinstance(rc, redis.RedisCluster)
    groups = cluster_runs.spread(cluster_runs.slot_ranges(rc), 2)
    assert len(groups) == 3 and all(len(g) == 2 for g in groups)
    ports = {rc.get_node_from_key(q.keys(n).pending).port for g in groups
             for n in g}
    assert len(ports) == 3                                  # every shard has queues
    for g in groups:
        for name in g:
            q.reset(rc, queue=name)
            q.enqueue(rc, {"n": name}, "same-id", queue=name)
            q.enqueue(rc, {"n": name}, "next-id", queue=name)
    for g in groups:                        # one id, one job per queue, no mix-up
        for name in g:
            job_id, payload, attempt = q.claim(rc, 30, queue=name)
            assert (job_id, payload, attempt) == ("same-id", {"n": name}, 1)
            acked, nxt = q.ack_and_claim(rc, job_id, attempt, 30, queue=name)
            assert acked and nxt == ("next-id", {"n": name}, 1)  # one slot, 5 keys
            assert q.ack(rc, nxt[0], nxt[2], queue=name)
            assert q.claim(rc, 30, queue=name) is None
    plain = EmbeddedRedis().start()
    try:
        assert type(connect(plain.url)) is redis.Redis
        with pytest.raises(RedisUnavailable, match="not a cluster node"):
            cluster_client(plain.url)
    finally:
        plain.stop()
    with pytest.raises(ValueError, match="braces"):
        q.keys("a}b")


def test_contract_checks_pass_on_the_cluster(cluster):
    """The quick half of the checks (the concurrent ones take a minute here)."""
    only = ["enqueue_idempotent", "claim_returns_payload_and_attempt",
            "zombie_ack_refused", "owner_ack_after_zombie",
            "poison_to_dlq_with_reason", "bound_refuses"]
    results = run_checks("handson.q", cluster.url, only=only)
    assert [r.name for r in results if not r.ok] == [], [r.line() for r in results]


def test_chaos_run_is_valid_on_the_cluster(cluster, tmp_path):
    # Kills keyed to claims, not the clock: on a loaded machine a kill every
    # 0.15 s can land before a new worker has claimed anything, for ever.
    cfg = ChaosConfig(workers=2, docs=200, kill_every=0, kill_every_claims=15,
                      min_kills=3, seed=3, iters=4000, lease_s=1.0)
    report = chaos_run(cfg, redis_url=cluster.url, workdir=str(tmp_path))
    assert report.verdict == "valid", report.text()
    assert report.stats["kills"] >= 3 and report.stats["lost"] == 0


def test_wait_counts_this_connections_write(cluster):
    """WAIT 1 refuses while the replica is frozen, so it waited for our write."""
    rc = cluster_client(cluster.url, decode_responses=True)
    name = "wait-probe"
    primary = cluster.primary_for_slot(key_slot(q.keys(name).pending.encode()))
    replica = next(n for n in cluster.nodes if n.alive and n is not primary and
                   n.client().info("replication").get("master_port") == primary.port)
    cluster_runs._wait_one(rc, name, 1000)          # in sync: answers at once
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        q.enqueue(rc, {}, queue=name)
        with pytest.raises(cluster_runs.NotReplicated):
            cluster_runs._wait_one(rc, name, 200)
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    cluster_runs._wait_one(rc, name, 5000)
    q.reset(rc, queue=name)


def test_failover_counts_add_up_and_wait_keeps_what_it_acknowledged(cluster):
    """A lagging replica promoted: without WAIT acknowledged jobs vanish."""
    plain = cluster_runs.failover(cluster, cut_s=0.5)
    waited = cluster_runs.failover(cluster, cut_s=0.5, wait_ms=100)
    for f in (plain, waited):
        assert f.acknowledged > 0 and f.stuck == 0
        assert f.adds_up, f.summary()
        # The kill is stamped once the primary is reaped, so the first write
        # after it came from the promoted replica: the window covers the
        # promotion (a stamp taken before the signal gave 0.00 s against 2.27).
        assert f.covers_promotion, f.timeline
        t = f.timeline
        assert f.refused_s > t["unpromoted"] - t["kill"] > 0, f.summary()
    assert plain.lost > 0, plain.summary()        # the lag, made visible
    assert waited.lost == 0, waited.summary()     # WAIT 1 said a replica had them
    assert waited.refused > 0                     # ... and refused while none did


def test_bad_cluster_url_is_one_clear_line():
    env = dict(os.environ, REDIS_CLUSTER_URL="redis://127.0.0.1:1")
    res = subprocess.run([sys.executable, "-m", "handson.cluster_runs", "throughput"],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 3
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and "127.0.0.1:1" in res.stderr
