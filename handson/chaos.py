"""The seed's chaos test: N workers, a SIGKILL every 0.3 s, then the verdict.

    python -m handson.chaos WORKERS [--queue SPEC] [--docs N] [--seed S]
                            [--kill-every S] [--json] [...]

Environment as in the seed: CHAOS=0 runs without kills, IDEM=0 uses the naive
sink, ACK_DELAY widens the commit-to-ack window, ITERS sets the work per
document. REDIS_URL points at your server; without it a private one is started.
The run lasts until its fault quota is injected (at least LAB_KILLS kills by
default, more with --min-kills, --min-pauses, --min-crash-kills): while it is
not, more documents are enqueued; a run that cannot meet it within
--quota-cap-s is unknown. Exit code: 0 valid, 1 invalid, 2 unknown. With
--json the report is JSON on stdout and the progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from handson.faults.engine import ChaosConfig, run
from handson.redis_server import cli_redis

HELP = {
    "queue": "queue module: dotted name or path to a .py file",
    "docs": "documents to enqueue",
    "kill_every": "mean seconds between SIGKILLs (0: none; CHAOS=0 too)",
    "seed": "seeds which worker dies when, and the crash points' dice",
    "lease_s": "lease in seconds",
    "max_attempts": "attempts before the DLQ",
    "crash_p": "probability of dying at each crash point passed",
    "iters": "hash rounds per document (ITERS)",
    "poison_every": "doc i is poison when i %% N == 7 (0: none)",
    "drain_timeout_s": "the whole run's budget; past it the verdict is unknown",
    "pause_every": "mean seconds between SIGSTOPs of a worker (0: none)",
    "pause_s": "length of a pause (0: 1.5 leases)",
    "reapers": "extra processes that only call reap(), to race each other",
    "reaper_skew_s": "the extra reapers' wall clocks are this many seconds off",
    "kill_until": "chaos stops once this fraction of jobs is done",
    "kill_phase_s": "... or after this many seconds (0: no cap)",
    "min_kills": "quota: random SIGKILLs before the chaos may stop "
                 "(default: LAB_KILLS when there are kills, else 0)",
    "max_kills": "no more random SIGKILLs than this (0: no cap); kills at "
                 "crash points go on",
    "min_pauses": "quota: SIGSTOPs past the lease",
    "min_crash_kills": "quota: kills at EACH --crash-point that uses --crash-p",
    "min_reaps": "quota: expired leases taken back by reap()",
    "quota_cap_s": "the chaos's budget for its quota; short of it: unknown",
    "kill_every_claims": "a SIGKILL every ~N claims instead of every ~S seconds "
                         "(the seed then replays the same schedule)",
    "pause_every_claims": "a SIGSTOP every ~N claims",
    "reaper_pause_every_claims": "every ~N claims, stop the first extra reaper "
                                 "inside its next reap, between the reply that "
                                 "read a job and its next request, until that "
                                 "job is claimed again",
    "min_reaper_pauses": "quota: reaper pauses (an armed reap with no gap to "
                         "stop in counts too)",
}
LAB_KILLS = 10   # the lab's run: at least this many kills, however fast the machine


def parse(argv: list[str] | None) -> tuple[ChaosConfig, argparse.Namespace]:
    d = ChaosConfig()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workers", type=int)
    ap.add_argument("--json", action="store_true", help="JSON report on stdout")
    ap.add_argument("--workdir", default=None,
                    help="keep results.db, events/ and workers.log here")
    ap.add_argument("--crash-point", action="append", default=[], dest="crash_points",
                    help="after-claim, mid-call, mid-claim, mid-reap, after-commit, "
                         "during-heartbeat, on-poison (repeatable); POINT:P "
                         "gives it a probability of its own")
    ap.add_argument("--no-heartbeat", action="store_false", dest="heartbeat")
    ap.add_argument("--ack-before-work", action="store_true")
    ap.add_argument("--tx-effect", action="store_true",
                    help="the effect and the ack in one transaction (a queue "
                         "with finish(), such as handson.queues.pgq)")
    ap.add_argument("--fused", action="store_true",
                    help="workers ack a job and claim the next in one call")
    ap.add_argument("--zombie-pauses", action="store_true",
                    help="a paused worker stays stopped until its job is claimed "
                         "again, then acks while the new holder is stopped")
    ap.add_argument("--fault-reapers", action="store_true",
                    help="the extra reapers get the crash points and are killed "
                         "at random like workers, then restarted")
    for f in fields(ChaosConfig):
        if f.name in ("workers", "crash_points", "heartbeat", "ack_before_work",
                      "fused", "idem", "ack_delay", "zombie_pauses", "tx_effect",
                      "fault_reapers"):
            continue
        default = getattr(d, f.name)
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(default),
                        default=None if f.name == "min_kills" else default,
                        help=HELP.get(f.name, "").replace("LAB_KILLS", str(LAB_KILLS))
                        + ("" if f.name == "min_kills" else f" (default {default})"))
    args = ap.parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields(ChaosConfig)
              if hasattr(args, f.name)}
    values.update(
        workers=args.workers,
        idem=os.environ.get("IDEM", "1") == "1",
        ack_delay=float(os.environ.get("ACK_DELAY", "0") or 0))
    if os.environ.get("CHAOS", "1") == "0":
        values["kill_every"] = values["kill_every_claims"] = 0
    if values["min_kills"] is None:
        values["min_kills"] = (LAB_KILLS if values["kill_every"]
                               or values["kill_every_claims"] else 0)
    if "ITERS" in os.environ and args.iters == d.iters:
        values["iters"] = int(os.environ["ITERS"])
    try:
        return ChaosConfig(**values), args
    except ValueError as err:
        ap.error(str(err))


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse(argv)

    def progress(p: dict) -> None:
        print(f"[{p['elapsed_s']:6.1f} s] {p['done']}/{p['total']} done, "
              f"kills={p['kills']} pauses={p['pauses']} ({p['phase']})",
              file=sys.stderr, flush=True)

    try:
        with cli_redis():
            report = run(cfg, workdir=args.workdir, progress=progress)
    except KeyboardInterrupt:
        print("interrupted: the workers and the server this run started are "
              "stopped", file=sys.stderr)
        return 130
    if args.json:
        print(report.to_json())
    else:
        print(report.text())
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
