"""The reference queue on a Redis Cluster: throughput per shard, and a failover.

Many queues, one hash tag each, so each queue lives whole on one shard; the
clients are redis-py's cluster client; producers and workers are processes.

- `throughput`: clients that enqueue, claim and ack in a loop over queues
  placed on 1, 2 or 3 of the cluster's primaries, with the CPU each side used
  (on a small machine the clients, not Redis, run out first).
- `failover`: producers enqueue and workers claim and ack while one primary is
  killed with SIGKILL; its replica is elected in its place and the old primary
  comes back as a replica. Every call is logged with the machine's monotonic
  clock; after a drain the run counts enqueues that were acknowledged and are
  gone, acks that did not survive (jobs run again), and how long the shard
  refused writes. With `wait_ms`, each enqueue is followed by `WAIT 1` and
  counts as acknowledged only once a replica has it. With `cut_s`, the
  replica's link is cut (the replica frozen) that long before the kill: the
  replica lags, as one across a slow or broken network does.

    python -m handson.cluster_runs throughput
    python -m handson.cluster_runs failover [--wait-ms 100] [--cut-s 0.5]

REDIS_CLUSTER_URL: measure throughput on your cluster (a failover needs the
private one: it kills and restarts nodes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import redis
from redis.crc import key_slot

from handson import q
from handson.cluster import (
    DEFAULT_NODE_TIMEOUT_MS,
    EmbeddedCluster,
    cluster_client,
    embedded,
)
from handson.redis_server import (
    RedisUnavailable,
    cli_redis,
    connect,
    die_with_parent,
)

MAX_ATTEMPTS = 100      # a failover must not bury jobs: every retry is a rerun
CLIENT_TIMEOUTS = {"socket_timeout": 1.0, "socket_connect_timeout": 0.5}


def slot_ranges(rc: redis.RedisCluster) -> list[tuple[int, int, int]]:
    """(first slot, last slot, primary port) for each primary, by first slot."""
    node = rc.get_random_node()
    rows = rc.execute_command("CLUSTER SLOTS", target_nodes=node)
    if isinstance(rows, dict):                 # redis-py's parsed form
        return sorted((a, b, v["primary"][1]) for (a, b), v in rows.items())
    return sorted((a, b, primary[1]) for a, b, primary, *_ in rows)


def spread(ranges: list[tuple[int, int, int]], per_shard: int,
           shards: int | None = None) -> list[list[str]]:
    """Queue names, `per_shard` on each of the first `shards` shards.

    A name's shard is fixed by the CRC16 of its hash tag, so names are picked
    (in order: queue-0, queue-1, ...) to fill each shard's quota.
    """
    shards = len(ranges) if shards is None else shards
    out: list[list[str]] = [[] for _ in range(shards)]
    i = 0
    while any(len(names) < per_shard for names in out):
        name = f"queue-{i}"
        i += 1
        slot = key_slot(q.keys(name).pending.encode())
        s = next(k for k, (a, b, _) in enumerate(ranges) if a <= slot <= b)
        if s < shards and len(out[s]) < per_shard:
            out[s].append(name)
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_cpu_s() -> float:
    """CPU seconds every core of the machine has spent busy so far (/proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0]
             .split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)     # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _log(path: Path):
    f = open(path, "w", buffering=1)

    def ev(kind: str, **fields) -> None:
        f.write(json.dumps({"t": time.monotonic(), "ev": kind, **fields}) + "\n")
    return ev


def _child(target, *args) -> multiprocessing.Process:
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_run_child, args=(os.getpid(), target, *args), daemon=True)
    p.start()
    return p


def _run_child(parent: int, target, *args) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent stops us
    target(*args)


# -- throughput ---------------------------------------------------------------

def _round_trips(url: str, names: list[str], gate, seconds: float,
                 path: Path) -> None:
    """Enqueue, claim and ack one job at a time, round the queues, for `seconds`."""
    rc = connect(url, decode_responses=True)
    done, i = 0, 0
    gate.wait(30)                      # every client connected: start together
    cpu0, stop = time.process_time(), time.monotonic() + seconds
    while time.monotonic() < stop:
        name = names[i % len(names)]
        i += 1
        q.enqueue(rc, {"n": i}, queue=name)
        job_id, _, attempt = q.claim(rc, 30, queue=name)
        done += q.ack(rc, job_id, attempt, queue=name)
    path.write_text(json.dumps({"jobs": done, "cpu_s": time.process_time() - cpu0}))


@dataclass
class Throughput:
    shards: int                 # primaries the queues are spread over
    queues: int
    clients: int
    seconds: float
    jobs: int
    server_cpu_s: float         # all redis-server processes (primaries + replicas)
    client_cpu_s: float
    machine_cpu_s: float        # every process on the machine, ours or not
    cores: int
    wall_s: float               # how long the server and machine CPU were read

    def cores_busy(self, side: str) -> float:
        """Cores that 'server', 'clients' or the whole 'machine' kept busy."""
        if side == "clients":
            return self.client_cpu_s / self.seconds
        cpu = self.server_cpu_s if side == "server" else self.machine_cpu_s
        return cpu / self.wall_s

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    @property
    def busy(self) -> float:
        """Fraction of the machine's CPU in use by anything during the run."""
        return min(1.0, self.cores_busy("machine") / self.cores)


def throughput(url: str, shards: int, *, clients: int = 4, per_shard: int = 4,
               seconds: float = 1.0, server_pids: list[int] = ()) -> Throughput:
    """Jobs/s with the queues on the first `shards` primaries of the cluster."""
    rc = cluster_client(url, decode_responses=True)
    names = [n for group in spread(slot_ranges(rc), per_shard, shards)
             for n in group]
    for name in names:
        q.reset(rc, queue=name)
    work = Path(tempfile.mkdtemp(prefix="eo-tp-"))
    gate = multiprocessing.get_context("fork").Barrier(clients + 1)
    try:
        procs = [_child(_round_trips, url, names[i::clients] or names, gate, seconds,
                        work / f"{i}.json") for i in range(clients)]
        gate.wait(60)
        cpu0, all0 = sum(_cpu_s(p) for p in server_pids), _machine_cpu_s()
        t0 = time.monotonic()
        time.sleep(seconds)
        cpu1, all1 = sum(_cpu_s(p) for p in server_pids), _machine_cpu_s()
        wall = time.monotonic() - t0        # a busy machine oversleeps
        for p in procs:
            p.join(30)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"a throughput client failed: "
                               f"{[p.exitcode for p in procs]}")
        results = [json.loads((work / f"{i}.json").read_text())
                   for i in range(clients)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        rc.close()
    return Throughput(shards, len(names), clients, seconds,
                      sum(r["jobs"] for r in results), cpu1 - cpu0,
                      sum(r["cpu_s"] for r in results), all1 - all0,
                      os.cpu_count() or 1, wall)


def throughput_table(url: str, server_pids: list[int] = (), *, clients: int = 4,
                     seconds: float = 1.0) -> list[Throughput]:
    """The same twelve queues spread over 1, 2, ... all primaries of one cluster."""
    n = len(slot_ranges(cluster_client(url)))
    return [throughput(url, s, clients=clients, per_shard=max(1, 12 // s),
                       seconds=seconds, server_pids=server_pids)
            for s in range(1, n + 1)]


def throughput_figure(rows: list[Throughput]):
    """Jobs/s per primary count, beside the CPU each side used."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.0))
    left, right = fig.subplots(1, 2)
    xs = [r.shards for r in rows]
    left.bar(xs, [r.jobs_per_s for r in rows], color="#2c3e50", width=0.6)
    left.set_xticks(xs)
    left.set_xlabel("primaries the queues are spread over")
    left.set_ylabel("jobs / s (enqueue, claim, ack)")
    width = 0.27
    for k, (label, color, side) in enumerate([
            ("redis-server (all nodes)", "#c0392b", "server"),
            ("clients", "#2980b9", "clients"),
            ("whole machine", "#95a5a6", "machine")]):
        right.bar([x + (k - 1) * width for x in xs],
                  [r.cores_busy(side) for r in rows], width, color=color, label=label)
    right.axhline(rows[0].cores, ls="--", color="#7f8c8d", lw=0.8)
    right.set_xticks(xs)
    right.set_xlabel("primaries")
    right.set_ylabel("cores busy")
    right.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return fig


# -- failover -----------------------------------------------------------------

class NotReplicated(Exception):
    """WAIT timed out before a replica had the write."""


def _wait_one(rc: redis.RedisCluster, name: str, wait_ms: int) -> None:
    """WAIT 1 on the node that ran this queue's last write.

    WAIT counts the replicas that have this *connection's* last write. Each
    producer is one thread, and redis-py's pool hands a node's idle connection
    back last-in first-out, so this is the connection the enqueue just used.
    """
    node = rc.get_node_from_key(q.keys(name).pending)
    got = rc.execute_command("WAIT", 1, wait_ms, target_nodes=node)
    if isinstance(got, dict):
        got = next(iter(got.values()))
    if int(got) < 1:
        raise NotReplicated(f"WAIT 1 {wait_ms}: no replica has it")


def _producer(url: str, names: list[str], who: int, wait_ms: int, gate, stop,
              path: Path) -> None:
    """Enqueue round the queues; a refused job is retried, same id, next time."""
    ev = _log(path)
    rc = connect(url, decode_responses=True, **CLIENT_TIMEOUTS)
    gate.wait(60)
    retry: dict[str, str] = {}
    n = 0
    while not stop.is_set():
        for name in names:
            job_id = retry.pop(name, None)
            if job_id is None:
                job_id, n = f"p{who}-{n}", n + 1
            t0 = time.monotonic()
            try:
                q.enqueue(rc, {"by": who}, job_id, queue=name)
                if wait_ms:
                    _wait_one(rc, name, wait_ms)
            except (redis.RedisError, OSError, NotReplicated) as err:
                retry[name] = job_id
                ev("refused", job=job_id, queue=name, t0=t0,
                   why=type(err).__name__)
                time.sleep(0.005)
                continue
            ev("acked", job=job_id, queue=name, t0=t0)
    for name, job_id in retry.items():
        ev("unconfirmed", job=job_id, queue=name)


def _worker(url: str, names: list[str], lease_s: float, gate, stop,
            path: Path) -> None:
    """Claim round the queues, apply (a logged effect, not idempotent), ack, reap."""
    ev = _log(path)
    rc = connect(url, decode_responses=True, **CLIENT_TIMEOUTS)
    gate.wait(60)
    last_reap = 0.0
    while not stop.is_set():
        idle = True
        for name in names:
            try:
                job = q.claim(rc, lease_s, queue=name)
            except (redis.RedisError, OSError) as err:
                ev("claim_error", queue=name, why=type(err).__name__)
                time.sleep(0.005)
                continue
            if job is None:
                continue
            idle = False
            job_id, _, attempt = job
            ev("applied", job=job_id, attempt=attempt, queue=name)
            try:
                ok = q.ack(rc, job_id, attempt, queue=name)
            except (redis.RedisError, OSError) as err:
                ev("ack_error", job=job_id, attempt=attempt, why=type(err).__name__)
                continue
            ev("ack_ok" if ok else "ack_refused", job=job_id, attempt=attempt)
        if time.monotonic() - last_reap > lease_s / 4:
            last_reap = time.monotonic()
            for name in names:
                with contextlib.suppress(redis.RedisError, OSError):
                    q.reap(rc, MAX_ATTEMPTS, queue=name)
        if idle:
            time.sleep(0.005)


def wait_cost(url: str, n: int = 200, wait_ms: int = 100) -> dict[str, float]:
    """Median ms per enqueue without and with WAIT 1, in interleaved blocks.

    Interleaving puts both under the same background load, so the ratio holds
    on a busy machine even when the absolute times do not.
    """
    rc = cluster_client(url, decode_responses=True)
    name = "wait-cost"
    q.reset(rc, queue=name)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(n):
        waits = (i // 20) % 2 == 1
        t0 = time.perf_counter()
        q.enqueue(rc, {}, queue=name)
        if waits:
            _wait_one(rc, name, wait_ms)
        times[waits].append(time.perf_counter() - t0)
    q.reset(rc, queue=name)
    rc.close()
    plain, waited = (statistics.median(times[k]) * 1000 for k in (False, True))
    return {"plain_ms": plain, "wait_ms": waited, "ratio": waited / plain}


@dataclass
class Failover:
    wait_ms: int
    cut_s: float
    victim_queues: list[str]
    other_queues: list[str]
    timeline: dict[str, float]      # kill, fail, promoted, rejoined, first_write...
    acknowledged: int               # enqueues the producer was told succeeded
    applied: int                    # ... of which a worker ran at least once
    lost: int                       # ... never run, and the cluster has no trace
    stuck: int                      # ... never run, still queued after the drain
    forgotten: int                  # ran, but the cluster has no trace of them
    unconfirmed: int                # refused to the end (not acknowledged)
    unconfirmed_applied: int        # ... but ran anyway (the write had landed)
    run_twice: int                  # jobs applied more than once
    acks_lost: int                  # acked (True), then delivered again
    ack_errors: int                 # acks that got an error, not an answer
    refused: int                    # enqueue attempts refused (errors or no WAIT)
    refused_s: float                # kill (reaped) -> first write the new primary
                                    # acknowledged (its call began after the kill)
    rate_before: float              # acknowledged enqueues/s before the kill
    events: list[dict] = field(default_factory=list, repr=False)

    @property
    def covers_promotion(self) -> bool:
        """The refused window holds a moment when the shard had no primary.

        The old primary was dead and reaped at `kill`, and at `unpromoted` the
        replica still said it was a replica; a write acknowledged in between
        would mean the clock, not the cluster, is wrong.
        """
        t = self.timeline
        return t["kill"] < t["unpromoted"] < t["first_write"]

    @property
    def adds_up(self) -> bool:
        return self.acknowledged == self.applied + self.lost + self.stuck

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("events")
        return d


def _cluster_nodes(cluster: EmbeddedCluster) -> dict:
    for node in cluster.nodes:
        if node.alive:
            with contextlib.suppress(redis.RedisError):
                return node.client(decode_responses=True).execute_command(
                    "CLUSTER NODES")
    raise RedisUnavailable("no cluster node answers")


def _acked_since(work: Path, queues: set[str], since: float) -> bool:
    """A producer has logged a write to one of `queues` sent after `since`."""
    for path in work.glob("p*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):        # a line half written
                e = json.loads(line)
                if (e["ev"] == "acked" and e["queue"] in queues
                        and e["t0"] > since):
                    return True
    return False


def _until(what: str, ready, timeout: float, tick: float = 0.01) -> float:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            if ready():
                return time.monotonic()
        if time.monotonic() > deadline:
            raise RedisUnavailable(f"the failover run gave up waiting for {what} "
                                   f"({timeout} s)")
        time.sleep(tick)


def _promotion(replica, timeout: float = 20.0) -> tuple[float, float]:
    """(last moment the replica said it was a replica, first it said primary).

    Asked of the replica itself (ROLE), every 2 ms: it takes writes from the
    moment it says "master", so no write to its shard after the kill can be
    acknowledged before the first of the two times.
    """
    ask = replica.client(decode_responses=True)
    last_replica, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        with contextlib.suppress(redis.RedisError, OSError):
            if ask.execute_command("ROLE")[0] == "master":
                if last_replica is None:
                    raise RedisUnavailable("the replica was primary before the "
                                           "run first asked it")
                return last_replica, time.monotonic()
            last_replica = t0
        time.sleep(0.002)
    raise RedisUnavailable(f"the failover run gave up waiting for the replica's "
                           f"promotion ({timeout} s)")


def failover(cluster: EmbeddedCluster, *, wait_ms: int = 0, cut_s: float = 0.0,
             before_s: float = 0.8, after_s: float = 0.6, producers: int = 2,
             workers: int = 2, per_shard: int = 2, lease_s: float = 1.0
             ) -> Failover:
    """Kill the primary of the first shard under load; count what was lost."""
    _until("a healthy cluster", cluster.healthy, 30)
    rc = cluster_client(cluster.url, decode_responses=True)
    groups = spread(slot_ranges(rc), per_shard)
    names = [n for g in groups for n in g]
    victim_slot = key_slot(q.keys(groups[0][0]).pending.encode())
    primary = cluster.primary_for_slot(victim_slot)
    replica = next(n for n in cluster.nodes if n.alive and n is not primary and
                   n.client().info("replication").get("master_port") == primary.port)
    rc.flushdb()
    rc.close()
    work = Path(tempfile.mkdtemp(prefix="eo-failover-"))
    ctx = multiprocessing.get_context("fork")
    stop_producing, stop_working = ctx.Event(), ctx.Event()
    gate = ctx.Barrier(workers + producers + 1)
    procs = []
    t: dict[str, float] = {}
    try:
        procs += [_child(_worker, cluster.url, names[i:] + names[:i], lease_s, gate,
                         stop_working, work / f"w{i}.jsonl") for i in range(workers)]
        procs += [_child(_producer, cluster.url, names, i, wait_ms, gate,
                         stop_producing, work / f"p{i}.jsonl")
                  for i in range(producers)]
        gate.wait(60)                       # all connected: the load starts now
        t["start"] = time.monotonic()
        time.sleep(before_s)
        if cut_s:
            os.kill(replica.pid, signal.SIGSTOP)
            t["cut"] = time.monotonic()
            primary.client().client_kill_filter(_type="replica")
            time.sleep(cut_s)
        primary.kill()                      # SIGKILL, then reaped: it answers no one
        t["kill"] = time.monotonic()
        if cut_s:
            os.kill(replica.pid, signal.SIGCONT)
        victim = f"127.0.0.1:{primary.port}"
        t["fail"] = _until("the cluster to mark the primary failed", lambda: "fail"
                           in _cluster_nodes(cluster).get(victim, {}).get("flags", ""),
                           20)
        t["unpromoted"], t["promoted"] = _promotion(replica)
        primary.restart()                   # a supervisor brings it back
        t["restarted"] = time.monotonic()
        t["rejoined"] = _until("the old primary to sync as a replica", lambda:
                               primary.client().info("replication").get(
                                   "master_link_status") == "up", 20)
        # Producers find the new primary when their client next learns the
        # slots: on a loaded machine that may outlast `after_s`, and a run with
        # no write to the shard after the kill measures no refused window.
        t["written"] = _until("a write acknowledged by the shard's new primary",
                              lambda: _acked_since(work, set(groups[0]), t["kill"]),
                              20, tick=0.05)
        time.sleep(max(0.0, t["promoted"] + after_s - time.monotonic()))
        stop_producing.set()
        t["stop"] = time.monotonic()
        for p in procs[workers:]:
            p.join(10)
        rc = cluster_client(cluster.url, decode_responses=True)
        t["drained"] = _until("the queues to drain", lambda: all(
            s["pending"] == 0 and s["inflight"] == 0
            for s in (q.stats(rc, queue=n) for n in names)), 15, tick=0.05)
        stop_working.set()
        for p in procs[:workers]:
            p.join(10)
        events = []
        for path in sorted(work.glob("*.jsonl")):
            events += [json.loads(line) for line in path.read_text().splitlines()]
        events.sort(key=lambda e: e["t"])
        return _judge(rc, events, t, groups, wait_ms, cut_s)
    finally:
        stop_producing.set()
        stop_working.set()
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        with contextlib.suppress(ProcessLookupError, TypeError):
            if replica.pid:
                os.kill(replica.pid, signal.SIGCONT)
        shutil.rmtree(work, ignore_errors=True)


def _judge(rc, events: list[dict], t: dict[str, float], groups: list[list[str]],
           wait_ms: int, cut_s: float) -> Failover:
    victim = set(groups[0])
    acked = {e["job"]: e for e in events if e["ev"] == "acked"}
    unconfirmed = {e["job"] for e in events if e["ev"] == "unconfirmed"}
    runs = Counter(e["job"] for e in events if e["ev"] == "applied")
    queue_of = {e["job"]: e["queue"] for e in events if "queue" in e and "job" in e}
    status = {j: q.status(rc, j, queue=queue_of[j]) for j in acked}
    lost = [j for j, s in status.items() if s is None and not runs[j]]
    stuck = [j for j, s in status.items() if s in ("pending", "inflight")
             and not runs[j]]
    forgotten = [j for j, s in status.items() if s is None and runs[j]]
    acked_at: dict[str, float] = {}
    acks_lost = set()
    for e in events:
        if e["ev"] == "ack_ok":
            acked_at.setdefault(e["job"], e["t"])
        elif e["ev"] == "applied" and e["job"] in acked_at:
            acks_lost.add(e["job"])
    refused = [e for e in events if e["ev"] == "refused"]
    after = [e["t"] for e in events if e["ev"] == "acked" and e["queue"] in victim
             and e["t0"] > t["kill"]]
    t["first_write"] = min(after) if after else float("nan")
    end = t.get("cut", t["kill"])
    before = [e for e in events if e["ev"] == "acked" and e["t"] < end]
    span = end - t["start"]
    lost_set = set(lost)
    for e in events:
        if e["ev"] == "acked" and e["job"] in lost_set:
            e["lost"] = True
    return Failover(
        wait_ms, cut_s, sorted(victim), sorted(set(queue_of.values()) - victim), t,
        len(acked), sum(1 for j in acked if runs[j]), len(lost), len(stuck),
        len(forgotten),
        len(unconfirmed), sum(1 for j in unconfirmed if runs[j]),
        sum(1 for j in runs if runs[j] > 1), len(acks_lost),
        sum(e["ev"] == "ack_error" for e in events), len(refused),
        t["first_write"] - t["kill"], len(before) / span if span > 0 else 0.0,
        events)


def failover_table(scenarios: list[dict], **kwargs) -> list[Failover]:
    """Several failovers on one private cluster (each kills the shard's primary)."""
    with embedded(3) as cluster:
        return [failover(cluster, **s, **kwargs) for s in scenarios]


SCENARIOS = [             # the chapter's three: a plain kill; a lagging replica
    {"wait_ms": 0, "cut_s": 0.0},       # without WAIT, then with it
    {"wait_ms": 0, "cut_s": 0.5},
    {"wait_ms": 100, "cut_s": 0.5},
]


def failover_figure(f: Failover):
    """A timeline from the run's own events: writes per shard, faults, losses."""
    from matplotlib.figure import Figure

    t0 = f.timeline["kill"]
    victim = set(f.victim_queues)
    fig = Figure(figsize=(7, 4.0))
    ax = fig.subplots()
    bin_s = 0.05
    series: dict[str, Counter] = defaultdict(Counter)
    for e in f.events:
        if e["ev"] in ("acked", "refused"):
            side = "killed shard" if e["queue"] in victim else "other shards"
            series[f"{e['ev']}, {side}"][int((e["t"] - t0) // bin_s)] += 1
    styles = {"acked, killed shard": ("#c0392b", "-"),
              "acked, other shards": ("#2c3e50", "-"),
              "refused, killed shard": ("#e67e22", ":")}
    for label, (color, ls) in styles.items():
        c = series.get(label, Counter())
        if not c:
            continue
        xs = range(min(c), max(c) + 1)
        ax.step([x * bin_s for x in xs], [c[x] / bin_s for x in xs], where="post",
                color=color, ls=ls, label=label.replace("acked", "acknowledged"))
    marks = [("cut", "replica cut off"), ("kill", "SIGKILL primary"),
             ("fail", "marked failed"), ("promoted", "replica promoted"),
             ("rejoined", "old primary back as replica")]
    for key, text in marks:
        if key in f.timeline:
            x = f.timeline[key] - t0
            ax.axvline(x, color="#7f8c8d", lw=0.8)
            ax.text(x, 0.97, f" {text}", rotation=90, va="top", ha="left",
                    fontsize=7, transform=ax.get_xaxis_transform())
    lost = [e["t"] - t0 for e in f.events if e.get("lost")]
    if lost:
        ax.plot(lost, [0] * len(lost), "|", color="#8e44ad", ms=14, mew=1.2,
                label=f"acknowledged, then lost ({len(lost)})")
    ax.set_xlabel("seconds from the SIGKILL")
    ax.set_ylabel("enqueues / s")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.45)     # room for the labels above
    ax.set_xlim(right=max(ax.get_xlim()[1], f.timeline["rejoined"] - t0 + 0.6))
    ax.legend(frameon=False, fontsize=7, loc="upper center", ncol=2,
              bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    tp = sub.add_parser("throughput", help="jobs/s on 1, 2, 3 primaries")
    tp.add_argument("--seconds", type=float, default=2.0)
    tp.add_argument("--clients", type=int, default=4)
    fo = sub.add_parser("failover", help="SIGKILL a primary under load")
    fo.add_argument("--wait-ms", type=int, default=0, help="WAIT 1 after enqueue")
    fo.add_argument("--cut-s", type=float, default=0.0,
                    help="cut the replica off this long before the kill")
    args = ap.parse_args(argv)
    if args.what == "throughput" and (args.seconds <= 0 or args.clients < 1):
        ap.error("--seconds must be positive and --clients at least 1")
    if args.what == "failover" and not (
            args.wait_ms >= 0 and 0 <= args.cut_s < DEFAULT_NODE_TIMEOUT_MS / 1000):
        ap.error(f"--wait-ms must be >= 0 and --cut-s in [0, "
                 f"{DEFAULT_NODE_TIMEOUT_MS / 1000:g}) (shorter than the node "
                 "timeout, or the frozen replica is declared failed too)")
    with cli_redis():            # Redis trouble: one line and exit code 3
        if args.what == "throughput":
            with contextlib.ExitStack() as stack:
                url, pids = os.environ.get("REDIS_CLUSTER_URL"), []
                if not url:
                    cluster = stack.enter_context(embedded(3))
                    url, pids = cluster.url, cluster.pids()
                for row in throughput_table(url, pids, clients=args.clients,
                                            seconds=args.seconds):
                    print(f"{row.shards} primaries: {row.jobs_per_s:8,.0f} jobs/s  "
                          f"redis {row.cores_busy('server'):.2f} cores, clients "
                          f"{row.cores_busy('clients'):.2f} cores, machine "
                          f"{row.busy:.0%} busy")
        else:
            (f,) = failover_table([{"wait_ms": args.wait_ms, "cut_s": args.cut_s}])
            print(json.dumps(f.summary(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
