"""A log on Redis Streams: partitions, consumer groups, commits, lag, replay.

Kafka is the usual log, but it is not something this course can install next
to you, so the log here is Redis Streams, whose parts map onto Kafka's:

    Kafka                           here
    topic with N partitions         N streams  log:<topic>:<p>
    partition = hash(key) % N       crc32(key) % N  (stable across processes,
                                    unlike Python's salted hash())
    offset                          entry id  (e.g. 1700000000000-0)
    consumer group                  XGROUP CREATE on every partition's stream
    partition assigned to consumer  here: consumer i reads partition i
    commit offset                   XACK the entries read
    restart resumes at commit       a restarted consumer first re-reads its
                                    pending entries (XREADGROUP ... 0), then new
                                    ones (XREADGROUP ... >)
    lag = end offset - committed    entries not yet delivered + delivered but
                                    not acked (computed: Redis 6.2 has no lag
                                    field in XINFO GROUPS)
    reset offsets to replay         XGROUP SETID <group> <old id>

Consumers and job-queue workers are real processes (`python -m
handson.queues.streams_log consume ...`); the demos kill them with SIGKILL. Each demo
returns plain rows that the chapter prints as tables and the tests check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import redis

from handson.redis_server import connect

PROC_TIMEOUT_S = 30.0


# -- the log ------------------------------------------------------------------
def partition_for(key: str, partitions: int) -> int:
    """Same key, same partition, in every process and every run."""
    return zlib.crc32(key.encode()) % partitions


def stream(topic: str, p: int) -> str:
    return f"log:{topic}:{p}"


def produce(r: redis.Redis, topic: str, partitions: int, key: str, fields: dict,
            partition: int | None = None) -> tuple[int, str]:
    """Append one record; by its key's partition unless one is given."""
    p = partition_for(key, partitions) if partition is None else partition
    entry = r.xadd(stream(topic, p), {"key": key, **{k: str(v) for k, v in
                                                     fields.items()}})
    return p, _text(entry)


def create_group(r: redis.Redis, topic: str, partitions: int, group: str,
                 start: str = "0") -> None:
    """A reader: one consumer group on every partition, from `start`."""
    for p in range(partitions):
        r.xgroup_create(stream(topic, p), group, id=start, mkstream=True)


def set_position(r: redis.Redis, topic: str, p: int, group: str, entry_id: str) -> None:
    """Move a group back (or forward) on one partition: the replay knob."""
    r.xgroup_setid(stream(topic, p), group, entry_id)


def lag(r: redis.Redis, topic: str, partitions: int, group: str) -> list[dict]:
    """Per partition: records written but not yet acked by `group`."""
    rows = []
    for p in range(partitions):
        key = stream(topic, p)
        info = {_text(g["name"]): g for g in r.xinfo_groups(key)}
        if group not in info:
            raise KeyError(f"no group {group!r} on {key}")
        last = _text(info[group]["last-delivered-id"])
        pending = int(info[group]["pending"])
        start = "-" if last == "0-0" else f"({last}"
        undelivered = len(r.xrange(key, min=start, max="+"))
        rows.append({"partition": p, "length": r.xlen(key), "last_delivered": last,
                     "pending": pending, "undelivered": undelivered,
                     "lag": pending + undelivered})
    return rows


def read(r: redis.Redis, topic: str, p: int, group: str, consumer: str,
         count: int, new: bool = True) -> list[tuple[str, dict]]:
    """New entries (`>`) or this consumer's own pending ones (`0`)."""
    resp = r.xreadgroup(group, consumer, {stream(topic, p): ">" if new else "0"},
                        count=count)
    return [(_text(i), _fields(f)) for _, entries in resp or [] for i, f in entries]


def ack(r: redis.Redis, topic: str, p: int, group: str, ids: list[str]) -> int:
    return int(r.xack(stream(topic, p), group, *ids)) if ids else 0


def _go(topic: str) -> str:
    return f"log:{topic}:go"


def _release(topic: str) -> str:
    """Set once nothing that can go on without the slow record is left."""
    return f"log:{topic}:release"


def _reset(r: redis.Redis, topic: str, partitions: int) -> None:
    r.delete(*[stream(topic, p) for p in range(partitions)], f"log:{topic}:clock",
             _go(topic), _release(topic))


def _work(r: redis.Redis, slow: bool, work_ms: float, slow_ms: float,
          hold: str | None) -> None:
    """One record's work; a slow one, with `hold`, lasts until that key is set."""
    time.sleep((slow_ms if slow else work_ms) / 1000)
    deadline = time.monotonic() + PROC_TIMEOUT_S
    while slow and hold and not r.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.005)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _fields(f) -> dict:
    return {_text(k): _text(v) for k, v in (f or {}).items()}


# -- the processes ------------------------------------------------------------
def _ready_then_go(r: redis.Redis, f, go: str, deadline: float) -> None:
    """Say we are up, then wait for the producer's go: all start together."""
    f.write(json.dumps({"ready": os.getpid()}) + "\n")
    while not r.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit(f"no go signal ({go}) in time")
        time.sleep(0.002)


def consume(url: str, topic: str, p: int, group: str, name: str, out: Path,
            commit: str = "after", batch: int = 5, work_ms: float = 10,
            slow_ms: float = 1000, idle_s: float = 0.3,
            max_s: float = PROC_TIMEOUT_S, hold: str | None = None) -> None:
    """One consumer on partition p: its pending entries first, then new ones.

    commit="before": XACK a batch as soon as it is read (Kafka: commit, then
    process). commit="after": XACK it once every record is processed.
    Each processed record is one JSON line in `out`, flushed before the next.
    """
    if commit not in ("before", "after"):
        raise ValueError(f"commit must be 'before' or 'after', not {commit!r}")
    r = connect(url, decode_responses=True)
    clock = f"log:{topic}:clock"
    deadline = time.monotonic() + max_s
    with open(out, "a", buffering=1) as f:
        _ready_then_go(r, f, _go(topic), deadline)
        new, idle_since = False, time.monotonic()
        while time.monotonic() < deadline:
            if new:
                resp = r.xreadgroup(group, name, {stream(topic, p): ">"},
                                    count=batch, block=50)
                entries = [(i, fl) for _, es in resp or [] for i, fl in es]
            else:
                entries = read(r, topic, p, group, name, batch, new=False)
                new = not entries
            if not entries:
                if new and time.monotonic() - idle_since > idle_s:
                    return
                continue
            ids = [i for i, _ in entries]
            if commit == "before":
                ack(r, topic, p, group, ids)            # commit, then process
            for entry_id, fields in entries:
                _work(r, fields.get("slow") == "1", work_ms, slow_ms, hold)
                f.write(json.dumps({"id": entry_id, "p": p, "key": fields.get("key"),
                                    "seq": int(fields.get("seq", -1)),
                                    "clock": r.incr(clock), "at": time.time()}) + "\n")
            if commit == "after":
                ack(r, topic, p, group, ids)            # process, then commit
            idle_since = time.monotonic()
        raise SystemExit(f"consumer {name} ran past {max_s} s")


def queue_worker(url: str, out: Path, work_ms: float = 10, slow_ms: float = 1000,
                 idle_s: float = 0.3, max_s: float = PROC_TIMEOUT_S,
                 hold: str | None = None) -> None:
    """A job-queue worker on the course's queue (handson.q): any free one takes
    the next job, so a slow job holds up one worker, not a lane."""
    from handson import q

    r = connect(url)
    deadline = time.monotonic() + max_s
    with open(out, "a", buffering=1) as f:
        _ready_then_go(r, f, _go("queue"), deadline)
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            job = q.claim(r, lease_s=60)
            if job is None:
                if time.monotonic() - idle_since > idle_s:
                    return
                time.sleep(0.002)
                continue
            job_id, payload, attempt = job
            _work(r, bool(payload.get("slow")), work_ms, slow_ms, hold)
            f.write(json.dumps({"id": job_id, "key": payload["key"],
                                "seq": payload["seq"], "at": time.time()}) + "\n")
            q.ack(r, job_id, attempt)
            idle_since = time.monotonic()
        raise SystemExit(f"queue worker ran past {max_s} s")


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "handson.queues.streams_log", *args],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _lines(path: Path) -> list[dict]:
    """The whole lines of `path`: read while a process writes it, a last line
    not yet ended is left for the next look."""
    if not path.exists():
        return []
    text = path.read_text()
    rows = []
    for line in text[:text.rfind("\n") + 1].splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def _records(path: Path) -> list[dict]:
    return [x for x in _lines(path) if "ready" not in x]


def _seqs_done(outs: list[Path]) -> set[int]:
    return {x["seq"] for o in outs for x in _records(o)}


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.002)


def _ready(path: Path) -> bool:
    return any("ready" in x for x in _lines(path))


def _finish(procs: list[subprocess.Popen], timeout: float = PROC_TIMEOUT_S) -> None:
    """Wait for every process; kill and report any that did not end in time."""
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            errors.append(f"pid {proc.pid} did not finish in {timeout} s")
            continue
        if proc.returncode not in (0, -signal.SIGKILL):
            errors.append(f"pid {proc.pid} exited {proc.returncode}: "
                          f"{err.decode(errors='replace')[-800:]}")
    if errors:
        raise RuntimeError("; ".join(errors))


def _consumer_args(url, topic, p, group, name, out, **kw) -> list[str]:
    args = ["consume", "--url", url, "--topic", topic, "--partition", str(p),
            "--group", group, "--name", name, "--out", str(out)]
    for k, v in kw.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    return args


# -- the demos ----------------------------------------------------------------
def commit_demo(url: str, commit: str, records: int = 30, batch: int = 10,
                kill_after: int = 13, work_ms: float = 25) -> dict:
    """SIGKILL a consumer mid-batch, restart it in the same group, count.

    The record after `kill_after` hangs the first consumer (a stuck call), so
    the kill lands at the same place however loaded the machine is; the
    restarted consumer finds it quick. skipped: produced but never processed;
    replayed: processed more than once.
    """
    r = connect(url, decode_responses=True)
    topic = f"commit-{commit}"
    _reset(r, topic, 1)
    create_group(r, topic, 1, "scorer")
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.jsonl"
        args = _consumer_args(url, topic, 0, "scorer", "c1", out, commit=commit,
                              batch=batch, work_ms=work_ms)
        first = _spawn([*args, "--slow-ms", str(PROC_TIMEOUT_S * 1000)])
        _wait_until(lambda: _ready(out), PROC_TIMEOUT_S, "the consumer to start")
        ids = [produce(r, topic, 1, f"doc-{i}",
                       {"seq": i, **({"slow": "1"} if i == kill_after else {})},
                       partition=0)[1]
               for i in range(records)]
        r.set(_go(topic), 1)
        _wait_until(lambda: len(_records(out)) >= kill_after or first.poll()
                    is not None, PROC_TIMEOUT_S, f"{kill_after} processed records")
        os.kill(first.pid, signal.SIGKILL)
        _finish([first])
        at_kill = len(_records(out))
        pending_at_restart = int(r.xpending(stream(topic, 0), "scorer")["pending"])
        second = _spawn([*args, "--slow-ms", str(work_ms)])
        _finish([second])
        done = _records(out)
    seen = [x["id"] for x in done]
    return {"commit": commit, "produced": len(ids), "processed_before_kill": at_kill,
            "pending_at_restart": pending_at_restart,
            "processed": len(seen), "distinct": len(set(seen)),
            "skipped": len(set(ids) - set(seen)),
            "replayed": len(seen) - len(set(seen)),
            "skipped_ids": sorted(set(ids) - set(seen))}


def order_demo(url: str, keyed: bool, docs: int = 6, events: int = 8,
               partitions: int = 3, seed: int = 7) -> dict:
    """One consumer process per partition, each at its own speed.

    keyed=True: a doc's events share a partition (crc32 of the key).
    keyed=False: each event goes to a random partition (seeded).
    Counts events processed before an earlier event of the same doc, and
    entries processed out of entry-id order within a partition.
    """
    r = connect(url, decode_responses=True)
    topic = f"order-{'keyed' if keyed else 'spread'}"
    _reset(r, topic, partitions)
    create_group(r, topic, partitions, "indexer")
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        outs = [Path(d) / f"c{p}.jsonl" for p in range(partitions)]
        procs = [_spawn(_consumer_args(url, topic, p, "indexer", f"c{p}", outs[p],
                                       work_ms=2 + 6 * (partitions - 1 - p)))
                 for p in range(partitions)]
        for o in outs:
            _wait_until(lambda o=o: _ready(o), PROC_TIMEOUT_S, "consumers to start")
        for seq in range(events):
            for doc in range(docs):
                key = f"doc-{doc}"
                produce(r, topic, partitions, key, {"seq": seq},
                        partition=None if keyed else rnd.randrange(partitions))
        r.set(_go(topic), 1)
        _finish(procs)
        rows = sorted((x for o in outs for x in _records(o)), key=lambda x: x["clock"])
    late_per_key, out_of_order_in_partition = 0, 0
    newest: dict[str, int] = {}
    last_id: dict[int, tuple[int, int]] = {}
    for x in rows:
        if x["seq"] < newest.get(x["key"], -1):
            late_per_key += 1
        newest[x["key"]] = max(newest.get(x["key"], -1), x["seq"])
        eid = tuple(int(n) for n in x["id"].split("-"))
        if eid < last_id.get(x["p"], (0, 0)):
            out_of_order_in_partition += 1
        last_id[x["p"]] = eid
    spread = {}
    for x in rows:
        spread.setdefault(x["key"], set()).add(x["p"])
    return {"keyed": keyed, "events": len(rows),
            "partitions_per_doc": max(len(v) for v in spread.values()),
            "out_of_order_in_partition": out_of_order_in_partition,
            "late_per_key": late_per_key}


def check_order(keyed: dict, spread: dict) -> None:
    """Queues and logs' claim: keyed, a document's events stay in order; spread at
    random they do not; within a partition, order always holds."""
    if not keyed["late_per_key"] == 0 < spread["late_per_key"]:
        raise AssertionError(f"keyed must keep each document's order and random "
                             f"partitions must break it: {keyed}, {spread}")
    if keyed["out_of_order_in_partition"] or spread["out_of_order_in_partition"]:
        raise AssertionError(f"a partition is read in order: {keyed}, {spread}")


def check_commits(before: dict, after: dict) -> None:
    """Queues and logs' claim: XACK before the work skips records after a kill
    and replays none; XACK after the work skips none and replays some."""
    if not (before["skipped"] > 0 and before["replayed"] == 0):
        raise AssertionError(f"commit before the work must skip, not replay: "
                             f"{before}")
    if not (after["skipped"] == 0 and after["replayed"] > 0):
        raise AssertionError(f"commit after the work must replay, not skip: {after}")


def slow_record_demo(url: str, records: int = 30, partitions: int = 3,
                     slow_s: float = 1.0, work_ms: float = 20) -> list[dict]:
    """One slow record: the log's partition waits behind it, the queue does not.

    The same records go to a log (one consumer per partition) and to the
    course's job queue (as many workers as partitions). For each we report how
    many normal records finished after the slow one did, and when the last
    normal record finished. The slow record takes `slow_s`, and then lasts
    until every record that need not wait for it is done (those in other
    partitions, for the log; every other job, for the queue), so what finishes
    after it is what waited for it, however busy the machine. It empties the
    course queue first (`q.reset`).
    """
    from handson import q

    r = connect(url, decode_responses=True)
    topic = "slow"
    _reset(r, topic, partitions)
    r.delete(_go("queue"), _release("queue"))
    create_group(r, topic, partitions, "scorer")
    q.reset(r)
    slow_seq = 1
    slow_key = f"doc-{slow_seq}"
    results = []
    with tempfile.TemporaryDirectory() as d:
        for system in ("log", "queue"):
            outs = [Path(d) / f"{system}{i}.jsonl" for i in range(partitions)]
            if system == "log":
                procs = [_spawn(_consumer_args(url, topic, p, "scorer", f"c{p}",
                                               outs[p], work_ms=work_ms,
                                               slow_ms=slow_s * 1000, batch=1,
                                               hold=_release(topic)))
                         for p in range(partitions)]
            else:
                procs = [_spawn(["queue-worker", "--url", url, "--out", str(o),
                                 "--work-ms", str(work_ms),
                                 "--slow-ms", str(slow_s * 1000),
                                 "--hold", _release("queue")]) for o in outs]
            for o in outs:
                _wait_until(lambda o=o: _ready(o), PROC_TIMEOUT_S, f"{system} readers")
            t0 = time.time()
            for i in range(records):
                key, slow = f"doc-{i}", f"doc-{i}" == slow_key
                if system == "log":
                    produce(r, topic, partitions, key, {"seq": i, "slow": int(slow)})
                else:
                    q.enqueue(r, {"key": key, "seq": i, "slow": slow})
            name = topic if system == "log" else "queue"
            r.set(_go(name), 1)
            lane = partition_for(slow_key, partitions)
            # what need not wait for the slow record: for the log, the records
            # not behind it in its partition; for the queue, every other job
            free = {i for i in range(records) if i != slow_seq and (
                system == "queue" or i < slow_seq
                or partition_for(f"doc-{i}", partitions) != lane)}
            with contextlib.suppress(TimeoutError):
                _wait_until(lambda free=free, outs=outs: free <= _seqs_done(outs),
                            PROC_TIMEOUT_S, "the records free of the slow one")
            r.set(_release(name), 1)
            _finish(procs)
            rows = [x for o in outs for x in _records(o)]
            slow_done = next(x["at"] for x in rows if x["key"] == slow_key)
            normal = [x for x in rows if x["key"] != slow_key]
            behind = sum(partition_for(x["key"], partitions) == lane
                         and x["seq"] > slow_seq for x in normal)
            results.append({
                "system": system, "readers": partitions, "records": len(rows),
                "normal_after_slow": sum(x["at"] > slow_done for x in normal),
                "behind_slow_in_partition": behind if system == "log" else None,
                "last_normal_s": round(max(x["at"] for x in normal) - t0, 2),
                "slow_done_s": round(slow_done - t0, 2)})
    return results


def lag_demo(r: redis.Redis, partitions: int = 3, records: int = 30) -> list[dict]:
    """A group that read part of each partition: its lag, partition by partition."""
    topic = "lagdemo"
    r.delete(*[stream(topic, p) for p in range(partitions)])
    create_group(r, topic, partitions, "scorer")
    for i in range(records):
        produce(r, topic, partitions, f"doc-{i}", {"seq": i})
    first = read(r, topic, 0, "scorer", "c0", count=1000)
    ack(r, topic, 0, "scorer", [i for i, _ in first])          # p0: all done
    read(r, topic, 1, "scorer", "c1", count=3)                  # p1: 3 read, not acked
    return lag(r, topic, partitions, "scorer")                  # p2: untouched


def readers_demo(r: redis.Redis, records: int = 20, replay_from: int = 5) -> list[dict]:
    """Two groups read one log independently; then one replays from an old id."""
    topic = "readers"
    r.delete(stream(topic, 0))
    ids = [produce(r, topic, 1, f"doc-{i}", {"seq": i}, partition=0)[1]
           for i in range(records)]
    create_group(r, topic, 1, "summarizer")
    create_group(r, topic, 1, "indexer")
    rows = []

    def step(what, group, got):
        ack(r, topic, 0, group, [i for i, _ in got])
        rows.append({"step": what, "group": group, "read": len(got),
                     "first_seq": int(got[0][1]["seq"]) if got else None,
                     "summarizer_lag": lag(r, topic, 1, "summarizer")[0]["lag"],
                     "indexer_lag": lag(r, topic, 1, "indexer")[0]["lag"]})

    step("summarizer reads everything", "summarizer",
         read(r, topic, 0, "summarizer", "s1", count=1000))
    step("indexer reads half", "indexer",
         read(r, topic, 0, "indexer", "i1", count=records // 2))
    # replay: put the summarizer back to just before record `replay_from`
    set_position(r, topic, 0, "summarizer", ids[replay_from - 1])
    step(f"summarizer replays from record {replay_from}", "summarizer",
         read(r, topic, 0, "summarizer", "s1", count=1000))
    return rows


# -- command line (the processes the demos start) ------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("consume", help="one consumer on one partition")
    c.add_argument("--url", required=True)
    c.add_argument("--topic", required=True)
    c.add_argument("--partition", type=int, required=True)
    c.add_argument("--group", required=True)
    c.add_argument("--name", required=True)
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--commit", choices=("before", "after"), default="after")
    c.add_argument("--batch", type=int, default=5)
    c.add_argument("--work-ms", type=float, default=10)
    c.add_argument("--slow-ms", type=float, default=1000)
    c.add_argument("--hold", help="a slow record lasts until this key is set")
    w = sub.add_parser("queue-worker", help="one worker on the course's job queue")
    w.add_argument("--url", required=True)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--work-ms", type=float, default=10)
    w.add_argument("--slow-ms", type=float, default=1000)
    w.add_argument("--hold", help="a slow job lasts until this key is set")
    a = ap.parse_args(argv)
    if a.cmd == "consume":
        consume(a.url, a.topic, a.partition, a.group, a.name, a.out, commit=a.commit,
                batch=a.batch, work_ms=a.work_ms, slow_ms=a.slow_ms, hold=a.hold)
    else:
        queue_worker(a.url, a.out, work_ms=a.work_ms, slow_ms=a.slow_ms,
                     hold=a.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
