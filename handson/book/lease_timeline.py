"""One job's lease, renewals and zombie, taken from a real chaos run's event log.

A chaos run with pauses (SIGSTOP) and no kills: a paused worker stops renewing,
its lease runs out, another worker claims the job, and when the first one wakes
its next call is refused. The figure draws one such job from the workers' own
events, so the picture is the record of a run, not a sketch.
"""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

from handson.breakit import iters_for
from handson.faults.engine import ChaosConfig
from handson.faults.engine import run as chaos_run
from handson.faults.logs import _read_events

ENDS = ("ack", "ack_refused", "extend_refused", "abandoned", "fail")


def _zombie(events: list[dict]) -> tuple[str, int, list[dict]] | None:
    """A finished job whose older attempt was refused after a newer claim.

    Returns the job, the refused (zombie) attempt and the job's events.
    """
    by_job = defaultdict(list)
    for e in events:
        if "job" in e:
            by_job[str(e["job"])].append(e)
    found = []
    for job, evs in by_job.items():
        if not any(e["ev"] == "ack" for e in evs):
            continue
        claims = [e for e in evs if e["ev"] == "claim"]
        for e in evs:
            if e["ev"] in ("ack_refused", "extend_refused") and any(
                    c["attempt"] > e["attempt"] and c.get("t0", c["t"]) < e["t"]
                    for c in claims):
                found.append((e["ev"] != "ack_refused", job, e["attempt"]))
    if not found:
        return None
    _, job, attempt = min(found)           # a refused ack first, if there is one
    return job, attempt, by_job[job]


def record(url: str, seeds: tuple[int, ...] = (1, 2, 3, 4), job_s: float = 0.6,
           lease_s: float = 0.3) -> dict:
    """Run until one job shows a zombie; its events in seconds from its first claim."""
    iters = iters_for(job_s)
    for seed in seeds:
        # Pauses held until the other worker claims the reaped job (zombie
        # pauses), keyed to claims, and a quota of one zombie that keeps the
        # run going until it has one: built, not a race between a pause and
        # the end of a short backlog on a loaded machine. The new holder waits
        # up to 3 s for the zombie's answer: on a busy machine a zombie woken
        # for half a lease may not have run at all (no refusal to draw). A
        # zombie pause ends when its job is claimed again, so its cap only
        # matters when the other worker is slow to get there: at 20 leases
        # (6 s) a loaded machine let the pause end first in 3 runs of 50,
        # the zombie took its own job back, and the run tried for a minute
        # more; at 100 leases, none in 50.
        cfg = ChaosConfig(docs=4, workers=2, iters=iters, lease_s=lease_s,
                          kill_every=0, pause_every_claims=2, pause_s=100 * lease_s,
                          zombie_pauses=True, min_zombies=1, hold_s=3.0, seed=seed)
        with tempfile.TemporaryDirectory(prefix="eo-lease-") as work:
            rep = chaos_run(cfg, redis_url=url, workdir=work)
            events = _read_events(Path(work) / "events")
        hit = _zombie(events)
        if hit is not None:
            job, zombie, evs = hit
            t0 = min(e["t"] for e in evs if e["ev"] == "claim")
            evs = [dict(e, s=(e["t"] - t0) / 1e9) for e in evs]
            return {"job": job, "zombie": zombie, "events": evs, "lease_s": lease_s,
                    "seed": seed,
                    "verdict": rep.verdict, "pauses": rep.stats["pauses"],
                    "applied": rep.stats["applied_histogram"]}
    raise RuntimeError(f"no zombie in {len(seeds)} runs with pauses; the last: "
                       f"{rep.verdict}, faults {rep.stats.get('faults')}")


def attempts(rec: dict) -> dict[int, dict]:
    """Per attempt: its worker, claim, renewals, the longest silence and its end."""
    out: dict[int, dict] = {}
    for e in rec["events"]:
        a = e.get("attempt")
        if a is None:
            continue
        x = out.setdefault(a, {"pid": e["pid"], "claim": None, "renewals": [],
                               "end": None, "end_ev": None, "commit": None})
        if e["ev"] == "claim":
            x["claim"] = e["s"]
        elif e["ev"] == "extend":
            x["renewals"].append(e["s"])
        elif e["ev"] == "commit":
            x["commit"] = e["s"]
        elif e["ev"] in ENDS and x["end"] is None:
            x["end"], x["end_ev"] = e["s"], e["ev"]
    for x in out.values():
        beats = [x["claim"], *x["renewals"]] + ([x["end"]] if x["end"] else [])
        gaps = [(b - a, a) for a, b in zip(beats, beats[1:], strict=False)]
        x["silence"], x["silence_from"] = max(gaps, default=(0.0, x["claim"]))
    return out


def figure(rec: dict):
    """Each attempt a row: claim, renewals, lease validity, the pause, the refusal."""
    from matplotlib.figure import Figure

    runs = attempts(rec)
    lease = rec["lease_s"]
    fig = Figure(figsize=(8, 1.1 + 0.9 * len(runs)))
    ax = fig.subplots()
    for row, (_, x) in enumerate(sorted(runs.items())):
        y = len(runs) - row
        beats = [x["claim"], *x["renewals"]]
        for b in beats:       # a claim or renewal holds the lease until b + lease
            ax.barh(y, lease, left=b, height=0.28, color="#3a7", alpha=0.18)
        ax.plot(beats[1:], [y] * (len(beats) - 1), "|", ms=14, color="#3a7",
                label="renewal" if row == 0 else None)
        ax.plot([x["claim"]], [y], "o", color="#1f2d5a",
                label="claim" if row == 0 else None)
        if x["silence"] > lease:
            ax.axvspan(x["silence_from"], x["silence_from"] + x["silence"],
                       ymin=(y - 0.45) / (len(runs) + 1),
                       ymax=(y + 0.45) / (len(runs) + 1), color="#999", alpha=0.25)
            ax.text(x["silence_from"] + x["silence"] / 2, y + 0.3,
                    f"no renewal for {x['silence']:.2f} s", ha="center", fontsize=8)
        if x["commit"] is not None:
            ax.plot([x["commit"]], [y], "s", color="#1f2d5a", ms=6,
                    label="commit" if row == 0 else None)
        if x["end"] is not None:
            refused = x["end_ev"] in ("ack_refused", "extend_refused")
            ax.plot([x["end"]], [y], "X" if refused else "D", ms=10,
                    color="#b22" if refused else "#3a7")
            ax.text(x["end"], y - 0.38, x["end_ev"].replace("_", " "), ha="center",
                    fontsize=8, color="#b22" if refused else "#3a7")
    ax.set_yticks(range(len(runs), 0, -1),
                  [f"attempt {a}\nworker {x['pid']}" for a, x in sorted(runs.items())])
    ax.set_ylim(0.3, len(runs) + 0.7)
    ax.set_xlabel("seconds since the job's first claim")
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3,
              fontsize=8)
    fig.tight_layout()
    return fig
