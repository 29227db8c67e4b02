"""What grading produces: a check, its outcome, a graded submission.

Plain data with its own text, below both the judges and the notebooks: the
judges build outcomes, the feedback page draws them, and neither has to import
the other for the types.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Check:
    """One graded property: its stable name (= the grade cell's id) and points."""

    name: str
    points: int
    title: str


@dataclass
class Outcome:
    """The verdict on one check, with what the learner needs to act on it."""

    name: str
    title: str
    max_points: int
    ok: bool
    message: str = ""                 # what went wrong and what to do about it
    expected: str = ""
    got: str = ""
    witnesses: list[str] = field(default_factory=list)
    replay: str = ""
    timelines: list[dict] = field(default_factory=list)   # witnesses, to draw

    @property
    def points(self) -> int:
        return self.max_points if self.ok else 0

    def explain(self) -> str:
        """The failure as one readable block: message, expected vs got, witnesses."""
        lines = [f"{self.name}: {self.message or self.title}"]
        if self.expected or self.got:
            lines += [f"  expected: {self.expected}", f"  got:      {self.got}"]
        for w in self.witnesses[:3]:
            lines.append("  witness:  " + w.replace("\n", "\n            "))
        if self.replay:
            lines.append(f"  replay:   {self.replay}")
        return "\n".join(lines)


def outcome(check: Check, ok: bool, message: str = "", expected="", got="",
            witnesses=(), replay: str = "") -> Outcome:
    return Outcome(check.name, check.title, check.points, bool(ok),
                   "" if ok else message, str(expected), str(got),
                   list(witnesses), "" if ok else replay)


@dataclass
class Evaluation:
    """What an assignment's evaluate() returns to the grader."""

    outcomes: list[Outcome]
    problems: list[str] = field(default_factory=list)
    invariants: dict = field(default_factory=dict)
    replay: str = ""
    efficiency: dict = field(default_factory=dict)   # handson.queues.cost.compare
    servers: dict = field(default_factory=dict)      # other servers' protections


def not_run(checks, reason: str) -> list[Outcome]:
    """Zero for every check that could not run, each saying why."""
    return [outcome(c, False, reason) for c in checks]


@dataclass
class GradeResult:
    """A graded submission: outcomes per check, problems, invariants, replay."""

    assignment: str
    submission: str
    outcomes: list[Outcome]
    problems: list[str] = field(default_factory=list)
    invariants: dict = field(default_factory=dict)     # name -> ok/None
    replay: str = ""
    elapsed_s: float = 0.0
    quick: bool = False
    isolation: str = ""          # which sandbox protections held: full / partial / none
    server_isolation: str = ""   # the same for the run's Redis server
    servers: dict = field(default_factory=dict)   # every server's: name -> that
    notes: list[str] = field(default_factory=list)   # e.g. test cells restored
    efficiency: dict = field(default_factory=dict)   # shown beside the reference

    @property
    def score(self) -> int:
        return sum(o.points for o in self.outcomes)

    @property
    def max_score(self) -> int:
        return sum(o.max_points for o in self.outcomes)

    def points(self) -> dict[str, int]:
        return {o.name: o.points for o in self.outcomes}

    def to_json(self) -> str:
        data = {"assignment": self.assignment, "submission": self.submission,
                "score": self.score, "max_score": self.max_score,
                "quick": self.quick, "elapsed_s": round(self.elapsed_s, 2),
                "problems": self.problems, "notes": self.notes,
                # "<name>_ok": true when the invariant held in every chaos
                # run, false when a run broke it, null when unknown.
                "invariants": {f"{k}_ok": v for k, v in self.invariants.items()},
                "replay": self.replay, "isolation": self.isolation,
                "server_isolation": self.server_isolation,
                "servers": self.servers, "efficiency": self.efficiency,
                "checks": [dict(asdict(o), points=o.points) for o in self.outcomes]}
        return json.dumps(data, indent=2)

    def text(self) -> str:
        width = max(len(o.name) for o in self.outcomes) if self.outcomes else 10
        lines = [f"{self.assignment}: {self.submission}"
                 + ("  (quick check: fewer cases where an assignment has them)"
                    if self.quick else "")]
        for p in self.problems:
            lines.append(f"  ! {p}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        lines.append("")
        for o in self.outcomes:
            mark = "PASS" if o.ok else "FAIL"
            lines.append(f"  [{mark}] {o.name:<{width}}  "
                         f"{o.points:>2}/{o.max_points:<2}  {o.title}")
        lines.append(f"  score {self.score}/{self.max_score}"
                     f"  ({self.elapsed_s:.1f} s)")
        if self.isolation:
            lines.append(f"  isolation: {self.isolation}")
        for name, held in (self.servers or {"Redis": self.server_isolation}).items():
            if held:
                lines.append(f"  the run's {name} server: {held}")
        if self.invariants:
            lines.append("")
            lines.append("  chaos invariants: " + ", ".join(
                f"{k}={'ok' if v is True else 'BROKEN' if v is False else 'unknown'}"
                for k, v in self.invariants.items()))
        if self.efficiency.get("yours"):
            lines += ["", cost_line(self.efficiency)]
        failed = [o for o in self.outcomes if not o.ok]
        if failed:
            lines += ["", "What to fix:"]
            for o in failed:
                lines.append("  " + o.explain().replace("\n", "\n  "))
        if self.replay:
            lines += ["", f"Replay the chaos run: {self.replay}"]
        return "\n".join(lines)


def cost_line(cost: dict) -> str:
    """The queue's cost per job beside the reference's, in one line (not graded)."""
    yours, ref = cost["yours"]["per_job"], cost["reference"]["per_job"]
    return (f"  cost per job (shown, not graded): {yours['round_trips']:g} Redis "
            f"round trips, {yours['commands']:g} commands, {yours['cpu_us']:.0f} µs "
            f"of server CPU; the reference queue in the same run: "
            f"{ref['round_trips']:g}, {ref['commands']:g}, {ref['cpu_us']:.0f} µs")
