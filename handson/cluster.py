"""A real Redis Cluster for the lab: N primaries, one replica each, on loopback.

Each node is the course's private redis-server (`EmbeddedRedis`: its own temp
dir, killed by the kernel if we die) started with cluster mode on. We join them
with plain cluster commands (CLUSTER ADDSLOTS, MEET, REPLICATE) rather than
`redis-cli --cluster create`, which refuses fewer than three primaries. The
cluster counts as up once every node sees all 16384 slots served and every
replica has finished its first sync.

    python -m handson.cluster                  # 3 primaries + 3 replicas
    python -m handson.cluster --primaries 2    # stays up until Ctrl-C

`REDIS_CLUSTER_URL` points the lab at a cluster you already run instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from handson.redis_server import EmbeddedRedis, RedisUnavailable, _version, connect

SLOTS = 16384
DEFAULT_NODE_TIMEOUT_MS = 1000


class ClusterNode(EmbeddedRedis):
    """One cluster node on a loopback port (its bus on port + 10000)."""

    def __init__(self, port: int, node_timeout_ms: int):
        super().__init__()
        self.port = port
        self.node_timeout_ms = node_timeout_ms
        self.url = f"redis://127.0.0.1:{port}"
        self.node_id = ""
        self._clients: dict[tuple, redis.Redis] = {}

    def _args(self) -> list[str]:
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--loglevel", "warning",
                "--logfile", str(self.dir / "redis.log"),
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.dir / "nodes.conf"),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # a replica may take over however long it was cut off: the lab
                # wants the failover, and shows what it costs
                "--cluster-replica-validity-factor", "0",
                # the other shards keep serving while one has no primary
                "--cluster-require-full-coverage", "no"]

    def client(self, **kwargs) -> redis.Redis:
        """A plain client for this node alone (cluster admin commands), reused."""
        kwargs.setdefault("socket_timeout", 5)
        key = tuple(sorted(kwargs.items()))
        if key not in self._clients:
            self._clients[key] = redis.Redis(host="127.0.0.1", port=self.port,
                                             **kwargs)
        return self._clients[key]

    def stop(self) -> None:
        for c in self._clients.values():
            c.close()
        super().stop()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _free_port() -> int:
    """A loopback port that is free, and whose cluster-bus port (+10000) is too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 >= 65536:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RedisUnavailable("no free pair of loopback ports for a cluster node")


@dataclass
class Shard:
    """A primary and its replica as started (roles change after a failover)."""

    primary: ClusterNode
    replica: ClusterNode | None
    slots: tuple[int, int]          # first and last slot, inclusive


class EmbeddedCluster:
    """N primaries with `replicas` replicas each; `stop` leaves nothing behind."""

    def __init__(self, primaries: int = 3, replicas: int = 1,
                 node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS):
        if primaries < 1 or replicas not in (0, 1):
            raise ValueError("need primaries >= 1 and replicas 0 or 1")
        self.n_primaries, self.n_replicas = primaries, replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[ClusterNode] = []
        self.shards: list[Shard] = []

    @property
    def url(self) -> str:
        live = [n for n in self.nodes if n.alive]
        return (live or self.nodes)[0].url

    def _start_node(self) -> ClusterNode:
        last: Exception | None = None
        for _ in range(3):        # a port taken between the probe and the bind
            node = ClusterNode(_free_port(), self.node_timeout_ms)
            try:
                node.start()
                self.nodes.append(node)
                return node
            except RedisUnavailable as err:
                last = err
        raise RedisUnavailable(f"a cluster node would not start: {last}")

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        total = self.n_primaries * (1 + self.n_replicas)
        for _ in range(total):
            self._start_node()
        for node in self.nodes:
            node.node_id = node.client(decode_responses=True).execute_command(
                "CLUSTER MYID")
        primaries = self.nodes[:self.n_primaries]
        replicas = self.nodes[self.n_primaries:]
        per = SLOTS // self.n_primaries
        for i, node in enumerate(primaries):
            first = i * per
            last = SLOTS - 1 if i == self.n_primaries - 1 else first + per - 1
            node.client().execute_command("CLUSTER ADDSLOTS",
                                          *range(first, last + 1))
            replica = replicas[i] if replicas else None
            self.shards.append(Shard(node, replica, (first, last)))
        head = self.nodes[0].client()
        for node in self.nodes[1:]:
            head.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        self._wait(deadline, "every node to know every other",
                   lambda: all(self._known(n) == total for n in self.nodes))
        for shard in self.shards:
            if shard.replica:
                shard.replica.client().execute_command(
                    "CLUSTER REPLICATE", shard.primary.node_id)
        self._wait(deadline, "all 16384 slots served and replicas in sync",
                   self.healthy)

    @staticmethod
    def _known(node: ClusterNode) -> int:
        table = node.client(decode_responses=True).execute_command("CLUSTER NODES")
        return sum("handshake" not in v["flags"] and "noaddr" not in v["flags"]
                   for v in table.values())

    @staticmethod
    def _wait(deadline: float, what: str, ready) -> None:
        while True:
            try:
                if ready():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RedisUnavailable(f"the cluster did not come up: waited for "
                                       f"{what}")
            time.sleep(0.05)

    def healthy(self) -> bool:
        """Every live node sees all slots served; every live replica is in sync."""
        for node in self.nodes:
            if not node.alive:
                continue
            c = node.client(decode_responses=True)
            info = c.execute_command("CLUSTER INFO")
            if info["cluster_state"] != "ok" or \
                    int(info["cluster_slots_ok"]) != SLOTS:
                return False
            repl = c.info("replication")
            if repl["role"] == "slave" and (
                    repl.get("master_link_status") != "up"
                    or repl.get("master_sync_in_progress")):
                return False
        return True

    def primary_for_slot(self, slot: int) -> ClusterNode:
        """The node serving `slot` now, as a live node sees it."""
        for node in self.nodes:
            if not node.alive:
                continue
            for first, last, (_, port, *_), *_ in node.client().execute_command(
                    "CLUSTER SLOTS"):
                if first <= slot <= last:
                    return next(n for n in self.nodes if n.port == port)
        raise RedisUnavailable(f"no live node serves slot {slot}")

    def stop(self) -> None:
        for node in self.nodes:          # all shut down at once, then wait for each
            if node.alive:
                node.proc.terminate()
        for node in self.nodes:
            node.stop()

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.pid]


def cluster_client(url: str, **kwargs) -> redis.RedisCluster:
    """A cluster client that has answered PING, or one clear RedisUnavailable."""
    client = connect(url, **kwargs)
    if not isinstance(client, redis.RedisCluster):
        client.close()
        raise RedisUnavailable(f"{url} is a Redis server, not a cluster node "
                               "(cluster_enabled is 0); point REDIS_CLUSTER_URL at "
                               "a node of a cluster, or unset it.")
    return client


@contextlib.contextmanager
def cluster_url(primaries: int = 3, node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
                ) -> Iterator[str]:
    """REDIS_CLUSTER_URL if set (checked), else a private cluster for the block."""
    env = os.environ.get("REDIS_CLUSTER_URL")
    if env:
        cluster_client(env).close()
        yield env
        return
    with embedded(primaries, node_timeout_ms=node_timeout_ms) as cluster:
        yield cluster.url


@contextlib.contextmanager
def embedded(primaries: int = 3, replicas: int = 1,
             node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS
             ) -> Iterator[EmbeddedCluster]:
    """A private cluster for the block's length (what the failover runs kill)."""
    cluster = EmbeddedCluster(primaries, replicas, node_timeout_ms).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--primaries", type=int, default=3, help="default 3")
    ap.add_argument("--replicas", type=int, default=1, choices=(0, 1),
                    help="replicas per primary (default 1)")
    ap.add_argument("--node-timeout-ms", type=int, default=DEFAULT_NODE_TIMEOUT_MS)
    args = ap.parse_args(argv)
    if args.primaries < 1 or args.node_timeout_ms < 100:
        ap.error("--primaries must be at least 1 and --node-timeout-ms at least 100")
    t0 = time.monotonic()
    try:
        cluster = EmbeddedCluster(args.primaries, args.replicas,
                                  args.node_timeout_ms).start()
    except RedisUnavailable as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 3
    try:
        version = ".".join(map(str, _version(cluster.nodes[0].binary)))
        print(f"Redis Cluster (redis-server {version}) up in "
              f"{time.monotonic() - t0:.1f} s: {len(cluster.shards)} primaries, "
              f"{args.replicas} replica each")
        for i, shard in enumerate(cluster.shards):
            rep = f", replica {shard.replica.port} (pid {shard.replica.pid})" \
                if shard.replica else ""
            print(f"  shard {i}: slots {shard.slots[0]}-{shard.slots[1]}, primary "
                  f"{shard.primary.port} (pid {shard.primary.pid}){rep}")
        print(f"export REDIS_CLUSTER_URL={cluster.url}")
        print(f"export REDIS_URL={cluster.url}    # the lab's clients see a cluster")
        print("Ctrl-C stops it.", flush=True)
        while any(n.alive for n in cluster.nodes):
            time.sleep(0.5)
        print("error: every node has exited", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
