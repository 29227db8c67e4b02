"""A chaos run's report: the verdict, the invariants, the faults, the replay.

What `run` returns and what every caller reads (the lab prints `text()`, the
grader reads the verdict and the invariants, `--json` writes `to_json()`), kept
apart from the machinery that produced it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from handson import verify
from handson.faults.config import ChaosConfig
from handson.faults.judge import INVARIANTS, Invariant
from handson.faults.server_clock import REPORT_MS


@dataclass
class Report:
    config: ChaosConfig
    verdict: str
    reason: str
    invariants: dict[str, Invariant]
    stats: dict
    replay: str
    pids: list[int] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def exit_code(self) -> int:
        return {"valid": 0, "invalid": 1}.get(self.verdict, 2)

    def headline(self) -> str:
        """The seed's own line."""
        s = self.stats
        return (f"done in {s['elapsed_s']:.1f} s, kills={s['kills']}, "
                f"dlq={s['dlq']}")

    def replay_note(self) -> str:
        """What the replay command reproduces, said honestly."""
        c = self.config
        keyed = [k for k, n in (("kills", c.kill_every_claims),
                                ("pauses", c.pause_every_claims),
                                ("reaper pauses", c.reaper_pause_every_claims))
                 if n]
        timed = [k for k, n in (("kills", not c.kill_every_claims and c.kill_every),
                                ("pauses", not c.pause_every_claims
                                 and c.pause_every)) if n]
        what = []
        if keyed:
            what.append(" and ".join(keyed) + " at the same claim counts")
        if timed:
            what.append(" and ".join(timed) + " at the same times")
        if c.crashing:
            what.append("the same crash-point dice")
        if not what:
            return f"seed {c.seed}; replay with:"
        return (f"seed {c.seed} reproduces the schedule ({'; '.join(what)}); the "
                "interleaving of the workers may differ. Replay with:")

    def faults_line(self) -> str:
        """Faults injected by kind, each against its quota when it has one."""
        f, quota = self.stats["faults"], self.config.quota
        def one(label: str, key: str, n: int) -> str:
            return f"{label} {n}" + (f" (quota {quota[key]})" if key in quota else "")
        parts = [one("kills", "kills", f["kills"]),
                 one("pauses", "pauses", f["pauses"])]
        parts += [one(f"at {p}", f"crash:{p}", n)
                  for p, n in f["crash_kills"].items()]
        parts.append(one("leases reaped", "reaps", f["leases_reaped"]))
        if "raced_reaps" in f:
            parts.append(f"leases reaped by {self.config.reapers} racing reapers "
                         f"{f['raced_reaps']}")
        if "reaper_kills" in f:
            parts.append(f"reapers killed {f['reaper_kills']}")
        if self.config.reaper_skew_s:
            parts.append(f"reapers' clocks {self.config.reaper_skew_s:+g} s off")
        if "reaper_pauses" in f:
            parts.append(one("reaper pauses mid-reap or armed reaps with no gap",
                             "reaper_pauses", f["reaper_pauses"] + f["reaps_no_gap"])
                         + f" ({f['reaper_pauses']} paused, "
                         f"{f['reaper_pauses_raced']} of them while a job it had "
                         f"read was claimed again; {f['reaps_no_gap']} no gap)")
        if "zombies" in f:
            parts.append(one("zombies (answered while a new claim was held)",
                             "zombies", f["zombies"]))
        return (f"faults injected: {', '.join(parts)}; {self.stats['claims']} "
                f"claims in {self.stats['chaos_s']:.1f} s of chaos")

    def text(self) -> str:
        c, s = self.config, self.stats
        docs = s.get("enqueued", c.docs)
        out = [f"chaos run on {c.queue}: {docs} docs, {c.workers} workers, "
               f"IDEM={int(c.idem)}, ACK_DELAY={c.ack_delay}, seed {c.seed}",
               self.headline() + f", crash-point kills={s['crash_kills']}, "
               f"pauses={s['pauses']}"]
        if "faults" in s:
            out.append(self.faults_line())
        if s.get("server_clock_gained_ms", 0) >= REPORT_MS:
            out.append(f"the Redis server's clock gained "
                       f"{s['server_clock_gained_ms']:.0f} ms on the workers' during "
                       "the run (a step forward); leases run on the server's clock, "
                       "so the judge allowed for it")
        if self.summary:
            out.append(verify.line(self.summary))
        out += ["", f"verdict: {self.verdict.upper()}"
                + (f" ({self.reason})" if self.reason else "")]
        for inv in self.invariants.values():
            mark = {True: "ok  ", False: "FAIL", None: "?   "}[inv.ok]
            out.append(f"  {mark} {inv.name:<22} {inv.count:>5}   "
                       f"{INVARIANTS[inv.name]}")
        for inv in self.invariants.values():
            if inv.ok is False and inv.witnesses:
                out += ["", f"{inv.name}: first {len(inv.witnesses)} of {inv.count}"]
                out += inv.witnesses
        out += ["", "applications per job: " + _hist(s["applied_histogram"]),
                "deliveries per job:   " + _hist(s["delivery_histogram"]),
                f"commits, no ack logged: {s['unacked']['died']} (worker died "
                f"first), {s['unacked']['refused']} (ack refused), "
                f"{s['unacked']['unlogged']} (ack landed, then the kill)",
                *self._orphans_line(),
                "", self.replay_note(), f"  {self.replay}"]
        return "\n".join(out)

    def _orphans_line(self) -> list[str]:
        o = self.stats.get("orphans", {})
        if not o.get("jobs"):
            return []
        return [f"jobs held by killed workers: {o['jobs']} ({o['prefetched']} "
                f"prefetched); at the kill {o['lease_left_s']:.2f} s of lease left "
                f"(median, of {self.config.lease_s:g} s); claimed again after "
                f"{o['median_wait_s']:.2f} s (median), {o['max_wait_s']:.2f} s at "
                "most"]

    def to_json(self) -> str:
        return json.dumps({
            "verdict": self.verdict, "exit_code": self.exit_code,
            "reason": self.reason, "seed": self.seed, "replay": self.replay,
            "invariants": {k: asdict(v) for k, v in self.invariants.items()},
            "stats": self.stats, "summary": self.summary,
            "config": asdict(self.config)}, indent=1)


def _hist(h: dict) -> str:
    return " | ".join(f"{k}x: {v}" for k, v in sorted(h.items(), key=lambda kv:
                                                       int(kv[0]))) or "-"
