"""One worker: claim a job, score it, write the score, ack; heartbeat meanwhile.

    REDIS_URL=... python -m handson.worker --queue handson.q --db results.db \\
        [--events DIR] [--lease 2] [--max-attempts 3] [--no-heartbeat] \\
        [--ack-before-work] [--tx-effect] [--fused]

Environment: IDEM (1: idempotent sink, 0: naive), ACK_DELAY (seconds between
commit and ack), ITERS (work per document), and for the chaos run CRASH_POINT
(comma-separated names from CRASH_POINTS), CRASH_P, CRASH_SEED: at a named
point the worker SIGKILLs itself with probability CRASH_P.

The worker uses the queue only through the contract functions, so any module
that meets the contract can be run, and judged, by the chaos engine. It imports
little because the chaos run restarts it after every kill.

With --fused (a queue that has `ack_and_claim`, as the reference does) a busy
worker acks its job and claims the next in one call, one round trip per job;
the next job's lease starts before the worker is ready for it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

import redis

from handson import produce, redis_server, setup_db, sink, work
from handson.infra import learner_host, remote_module
from handson.queues.contract import ContractError, load_queue

CRASH_POINTS = {
    "after-claim": "right after claim returns, before any work",
    "mid-call": "after any Redis reply inside a contract call, before it returns",
    "mid-claim": "after a Redis reply inside claim() (or ack_and_claim()), before "
                 "it returns",
    "mid-reap": "between two round trips of reap(): after a Redis reply, as it "
                "sends the next request (a reap that makes one has no such point)",
    "after-commit": "after the score is committed, before the ack",
    "mid-finish": "as finish() starts its last round trip (an SQL statement "
                  "or COMMIT): a finish in one transaction rolls back, one "
                  "that commits its effect apart from its ack leaves the "
                  "effect without the ack",
    "during-heartbeat": "in the heartbeat thread, right after an extend",
    "on-poison": "a poison document crashes the worker instead of raising",
}
CLAIMS = ("claim", "ack_and_claim")   # the calls that hand out a job
PID = os.getpid()
REAP_TICK_S = 0.02     # a --reap-only reaper calls reap() on these clock ticks


class Events:
    """JSON lines in DIR/<pid>.jsonl; one write per line, so a kill loses none."""

    def __init__(self, directory: str | None):
        self.fd = None
        if directory:
            path = os.path.join(directory, f"{PID}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(self, ev: str, **fields) -> None:
        if self.fd is not None:
            fields.update(ev=ev, pid=PID, t=time.monotonic_ns())
            os.write(self.fd, (json.dumps(fields) + "\n").encode())


def crash_points(specs) -> dict[str, float | None]:
    """"NAME" or "NAME:P" (a probability of its own) -> {name: P or None}.

    ValueError names what is wrong: an unknown point or a bad probability.
    """
    out: dict[str, float | None] = {}
    for spec in specs:
        name, _, p = spec.partition(":")
        if name not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {name!r}; known: "
                             f"{', '.join(CRASH_POINTS)}")
        try:
            out[name] = float(p) if p else None
        except ValueError:
            raise ValueError(f"crash point {spec!r}: {p!r} is not a "
                             "probability") from None
        if p and not 0 <= out[name] <= 1:
            raise ValueError(f"crash point {spec!r}: a probability is 0 to 1")
    return out


class Crashes:
    """Named crash points: SIGKILL ourselves there with a seeded probability.

    And a reaper's pause: armed (SIGUSR1 from the chaos engine, `armed`), the
    next reap that reads a job id in one Redis reply and then sends another
    request SIGSTOPs its own process there, between the read and the act, after
    logging `reaper_paused` with the ids; the engine resumes it. An armed reap
    that takes leases back with no such gap logs `reap_no_gap` instead.
    """

    def __init__(self, events: Events, pausing: bool = False):
        try:
            own = crash_points(p for p in os.environ.get("CRASH_POINT", "").split(",")
                               if p)
        except ValueError as err:
            sys.exit(f"CRASH_POINT: {err}")
        self.p = float(os.environ.get("CRASH_P", "0") or 0)
        self.p_at = {name: self.p if p is None else p for name, p in own.items()}
        self.points = set(self.p_at)
        self.rng = random.Random(int(os.environ.get("CRASH_SEED", "0") or 0))
        self.events = events
        self.call = threading.local()   # the contract call this thread is inside
        self.remote = None              # the queue's host, when it is behind a pipe
        self.armed = self.paused = False    # a reaper pause: armed, spent
        self.told = False                   # the armed reap's start was logged
        if self.points & {"mid-call", "mid-claim", "mid-reap", "mid-finish"} \
                or pausing:
            self._hook_replies()

    def maybe(self, point: str, **fields) -> None:
        if point in self.points and self.rng.random() < self.p_at[point]:
            self.events.log("crash_point", point=point, **fields)
            os.kill(PID, signal.SIGKILL)
            time.sleep(10)   # never reached: the signal is synchronous enough

    def pause_mid_reap(self, replies: int, jobs: list[str]) -> None:
        """Stop this process between two round trips of a reap that read
        `jobs`; the engine sends SIGCONT once they have moved on."""
        self.armed, self.paused, self.told = False, True, False
        jobs = [str(j)[:100] for j in jobs][:50] if isinstance(jobs, list) else []
        self.events.log("reaper_paused", jobs=jobs, after_reply=replies)
        os.kill(PID, signal.SIGSTOP)

    def _hook_replies(self) -> None:
        from redis.connection import AbstractConnection

        original = AbstractConnection.read_response
        crashes = self

        def read_response(conn, *args, **kwargs):
            reply = original(conn, *args, **kwargs)
            name = getattr(crashes.call, "name", None)
            if name:
                crashes.maybe("mid-call", call=name)
            if name in CLAIMS:
                crashes.maybe("mid-claim", call=name)
            if name == "reap" and not (getattr(crashes.call, "connecting", False)
                                       or getattr(crashes.call, "loading", False)):
                crashes.call.replies = getattr(crashes.call, "replies", 0) + 1
                if getattr(crashes.call, "watch", False):
                    crashes.call.seen |= learner_host.job_ids(reply, produce.JOB_IDS)
            crashes.call.loading = False
            return reply

        send, connect = (AbstractConnection.send_packed_command,
                         AbstractConnection.connect)

        def send_packed_command(conn, command, *args, **kwargs):
            if (getattr(crashes.call, "name", None) == "reap"
                    and not getattr(crashes.call, "connecting", False)
                    and getattr(crashes.call, "replies", 0)):
                crashes.maybe("mid-reap", call="reap")
                if getattr(crashes.call, "seen", None):
                    seen, crashes.call.seen = sorted(crashes.call.seen), set()
                    crashes.call.watch = False
                    crashes.pause_mid_reap(crashes.call.replies, seen)
            crashes.call.loading = learner_host.loads_script(command)
            return send(conn, command, *args, **kwargs)

        def connecting(conn, *args, **kwargs):
            """A new connection's handshake (and a script's reload, above) is
            no round trip of the call's own."""
            crashes.call.connecting = True
            try:
                return connect(conn, *args, **kwargs)
            finally:
                crashes.call.connecting = False

        AbstractConnection.read_response = read_response
        AbstractConnection.send_packed_command = send_packed_command
        AbstractConnection.connect = connecting

    def _armed(self, name: str) -> str | None:
        """The crash point, if any, that kills the queue's host in this call."""
        for point, only in (("mid-call", None), ("mid-claim", CLAIMS),
                            ("mid-reap", ("reap",)), ("mid-finish", ("finish",))):
            if (point in self.points and (only is None or name in only)
                    and self.rng.random() < self.p_at[point]):
                return point
        return None

    def inside(self, name: str, fn, *args):
        """Call a contract function, marking it for the mid-call crash points."""
        self.call.name, self.call.replies = name, 0
        self.call.watch, self.call.seen = name == "reap" and self.armed, set()
        if self.call.watch and self.remote is not None:
            self.remote.arm_pause_between(produce.JOB_IDS, self.pause_mid_reap)
        armed = self._armed(name) if self.remote is not None else None
        trips = self.remote.trips(name) if armed == "mid-finish" else 0
        if armed == "mid-finish" and trips < 2:
            armed = None            # its round trips are known after one call
        if armed == "mid-reap":   # as it sends a request after reply k, if it does
            self.remote.arm_crash_between(self.rng.randint(
                1, max(1, self.remote.replies(name) - 1)))
        elif armed == "mid-finish":
            self.remote.arm_crash_between(trips - 1)
        elif armed:  # the learner's host dies after one of the call's Redis replies
            self.remote.arm_crash(self.rng.randint(1, self.remote.replies(name)))
        try:
            return fn(*args)
        except remote_module.LearnerProcessDied:
            if armed:              # ... and so does the worker, as one process
                self.events.log("crash_point", point=armed, call=name)
                os.kill(PID, signal.SIGKILL)
                time.sleep(10)
            raise
        finally:
            self.call.name, self.call.watch = None, False


class Heartbeat(threading.Thread):
    """Extends the lease every lease/3; on a refusal sets `lost` and stops.

    A beat that fell due before `stop()` still goes out. A worker stopped past
    its beat (a pause, a zombie) beats as it runs again; when that came before
    its job's end was a race of its two threads, which the job's thread won
    whenever a loaded machine ran it first, so that a zombie's stale heartbeat
    never left (a broken extend went unseen in one chaos run of 240 under
    load)."""

    def __init__(self, w: Worker, job_id: str, attempt: int):
        super().__init__(daemon=True)
        self.w, self.job_id, self.attempt = w, job_id, attempt
        self.stopped = threading.Event()
        self.stop_at = float("inf")
        self.lost = False

    def run(self) -> None:
        w = self.w
        due = time.monotonic() + w.lease_s / 3
        while True:
            self.stopped.wait(max(0.0, due - time.monotonic()))
            if self.stopped.is_set() and self.stop_at < due:
                return
            t0 = time.monotonic_ns()
            try:
                ok = bool(w.crashes.inside("extend", w.q.extend, w.r, self.job_id,
                                          self.attempt, w.lease_s))
            except Exception as err:  # a broken queue or Redis: stop the job
                w.events.log("error", call="extend", error=repr(err))
                ok = False
            w.events.log("extend" if ok else "extend_refused", job=self.job_id,
                         attempt=self.attempt, t0=t0)
            if not ok:
                self.lost = True
                return
            w.crashes.maybe("during-heartbeat", job=self.job_id, attempt=self.attempt)
            due = time.monotonic() + w.lease_s / 3

    def stop(self) -> None:
        self.stop_at = time.monotonic()
        self.stopped.set()
        self.join(timeout=30)


class Worker:
    def __init__(self, args: argparse.Namespace, r: redis.Redis, q):
        self.r, self.q = r, q
        self.lease_s, self.max_attempts = args.lease, args.max_attempts
        self.heartbeat = not args.no_heartbeat and not args.ack_before_work
        self.ack_before_work = args.ack_before_work
        self.tx_effect = args.tx_effect
        self.fused = args.fused and not args.ack_before_work
        self.idem = os.environ.get("IDEM", "1") == "1"
        self.ack_delay = float(os.environ.get("ACK_DELAY", "0") or 0)
        self.events = Events(args.events)
        self.crashes = Crashes(self.events, getattr(args, "pause_mid_reap", False))
        if isinstance(q, remote_module.RemoteModule):
            self.crashes.remote = q
        self.db = setup_db.connect(args.db) if not args.reap_only else None
        self.stopping = False
        self.reap_every = min(0.5, self.lease_s / 2)

    def call(self, name: str, *args):
        return self.crashes.inside(name, getattr(self.q, name), self.r, *args)

    def reap(self) -> None:
        armed, self.crashes.paused = self.crashes.armed, False
        if armed and not self.crashes.told:   # the first armed reap's start, once
            self.events.log("reap_armed")
            self.crashes.told = True
        requeued, dead = self.call("reap", self.max_attempts)
        if self.crashes.paused:      # the engine waits for the paused reap's end
            self.events.log("reap_after_pause", requeued=requeued, dead=dead)
        if requeued or dead:
            self.events.log("reap", requeued=requeued, dead=dead)
            if armed and not self.crashes.paused:   # took them back in one go
                self.crashes.armed = self.crashes.told = False
                self.events.log("reap_no_gap", requeued=requeued, dead=dead)

    def run(self) -> None:
        self.events.log("start")
        last_reap, idle, job = 0.0, False, None
        while job is not None or not self.stopping:   # a prefetched job is finished
            if time.monotonic() - last_reap > self.reap_every:
                self.reap()
                last_reap = time.monotonic()
            if job is None:
                t0 = time.monotonic_ns()
                job = self.call("claim", self.lease_s)
                if job is None:
                    if not idle:
                        self.events.log("idle")
                        idle = True
                    time.sleep(0.05)
                    continue
                idle = False
                self.claimed(job, t0, "claim")
            job = self.process(*job)
        self.events.log("stop")

    def claimed(self, job, t0: int, via: str) -> None:
        job_id, _payload, attempt = job
        if type(attempt) is not int or attempt < 1:
            # The attempt is the fencing token the whole run is judged by (the
            # supervisor's zombies, the judge's stale acks): one that is not a
            # positive int (a str, a float, None, True) cannot be compared, and
            # one int() makes equal to another hides every zombie. Not judged.
            self.events.log("bad_attempt", job=job_id, call=via,
                            returned=repr(attempt)[:100])
            print(f"worker {PID}: {via}() returned attempt {attempt!r} for "
                  f"{job_id!r}; the attempt must be an int, 1 or more",
                  file=sys.stderr)
            sys.exit(2)
        self.events.log("claim", job=job_id, attempt=attempt, t0=t0, via=via)
        self.crashes.maybe("after-claim", job=job_id, attempt=attempt)

    def ack(self, job_id: str, attempt: int):
        """Ack the job; fused (and not stopping), claim the next too: that job."""
        t0 = time.monotonic_ns()
        nxt = None
        if self.fused and not self.stopping:
            ok, nxt = self.call("ack_and_claim", job_id, attempt, self.lease_s)
        else:
            ok = bool(self.call("ack", job_id, attempt))
        self.events.log("ack" if ok else "ack_refused", job=job_id, attempt=attempt,
                        t0=t0)
        if nxt is not None:
            self.claimed(nxt, t0, "ack_and_claim")
        return nxt

    def process(self, job_id: str, payload, attempt: int):
        """Work the job and end it; the next job when the ack fetched one."""
        if self.ack_before_work:
            self.ack(job_id, attempt)
        hb = Heartbeat(self, job_id, attempt) if self.heartbeat else None
        if hb:
            hb.start()
        try:
            if isinstance(payload, (str, bytes)):
                payload = json.loads(payload)
            s = work.score(payload["text"])
        except (ValueError, KeyError, TypeError) as err:
            if hb:
                hb.stop()
            if "POISON" in str(err):
                self.crashes.maybe("on-poison", job=job_id, attempt=attempt)
            error = str(err) if isinstance(err, ValueError) else f"bad payload: {err!r}"
            t0 = time.monotonic_ns()
            ok = bool(self.call("fail", job_id, attempt, error))
            self.events.log("fail", job=job_id, attempt=attempt, ok=ok, error=error,
                            t0=t0)
            return None
        if hb and hb.lost:
            hb.stop()
            self.events.log("abandoned", job=job_id, attempt=attempt)
            print(f"worker {PID}: lease of {job_id} attempt {attempt} was lost; "
                  "abandoned it (no commit, no ack)", file=sys.stderr)
            return None
        if self.tx_effect:
            self.finish(job_id, payload.get("doc_id"), s, attempt, hb)
            return None
        effect = sink.apply(self.db, job_id, payload.get("doc_id"), s, attempt,
                            self.idem)
        self.events.log("commit", job=job_id, attempt=attempt, effect=effect)
        self.crashes.maybe("after-commit", job=job_id, attempt=attempt)
        if self.ack_delay:
            time.sleep(self.ack_delay)
        if hb:
            hb.stop()
        return None if self.ack_before_work else self.ack(job_id, attempt)

    def finish(self, job_id: str, doc_id, s: float, attempt: int, hb) -> None:
        """--tx-effect: the effect and the ack commit as one transaction of the
        queue's database (its `finish`), so a refused ack leaves no effect."""
        if hb:
            hb.stop()
        t0 = time.monotonic_ns()
        ok = bool(self.call("finish", job_id, attempt, doc_id, s))
        if ok:
            self.events.log("commit", job=job_id, attempt=attempt, effect=True)
        self.events.log("ack" if ok else "ack_refused", job=job_id, attempt=attempt,
                        t0=t0)
        self.crashes.maybe("after-commit", job=job_id, attempt=attempt)

    def reap_forever(self) -> None:
        """--reap-only: a bare reaper, to make reapers race each other.

        Every reaper calls at the same ticks of the wall clock, so whenever a
        lease runs out, the next tick has all of them inside reap() at once.
        """
        self.events.log("start")
        while not self.stopping:
            self.reap()
            time.sleep(REAP_TICK_S - time.time() % REAP_TICK_S)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", default="handson.q", help="module name or path")
    ap.add_argument("--db", default="results.db")
    ap.add_argument("--events", default=None, help="directory for <pid>.jsonl")
    ap.add_argument("--lease", type=float, default=2.0, help="lease in seconds")
    ap.add_argument("--max-attempts", type=int, default=3)
    ap.add_argument("--no-heartbeat", action="store_true")
    ap.add_argument("--ack-before-work", action="store_true")
    ap.add_argument("--tx-effect", action="store_true")
    ap.add_argument("--fused", action="store_true",
                    help="ack a job and claim the next in one call (ack_and_claim)")
    ap.add_argument("--reap-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pause-mid-reap", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    url = os.environ.get("REDIS_URL")
    if not url:
        sys.exit("REDIS_URL is not set. Start a server with "
                 "`python -m handson.redis_server` and export the URL it prints.")
    try:
        q = load_queue(args.queue)
    except ContractError as err:
        sys.exit(str(err))
    if args.fused and not callable(getattr(q, "ack_and_claim", None)):
        sys.exit(f"--fused: {args.queue} has no ack_and_claim(r, job_id, attempt, "
                 "lease_s)")
    try:       # a plain server, or a cluster client if the URL names a node
        r = redis_server.connect(url, decode_responses=True)
    except redis_server.RedisUnavailable as err:
        sys.exit(f"worker {PID}: {err}")
    worker = Worker(args, r, q)

    def on_term(signum, frame):
        worker.stopping = True

    def on_arm(signum, frame):
        worker.crashes.armed = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if args.pause_mid_reap:      # before "start": the engine arms after that
        signal.signal(signal.SIGUSR1, on_arm)
    try:
        worker.reap_forever() if args.reap_only else worker.run()
    except redis.ConnectionError as err:
        sys.exit(f"worker {PID}: lost Redis at {url}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
