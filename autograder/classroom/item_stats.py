"""Which checks a class misses: per assignment, from the recorded grades.

For each assignment: every check's pass rate, the pairs of checks most often
failed by the same submission (a bug that costs two checks shows up as a
pair), and the score histogram. `grade-class` prints it and writes it as
`item-stats.md` in the course folder, for an instructor to open.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

BAR = 30           # characters of the longest histogram bar


@dataclass
class AssignmentStats:
    name: str
    n: int = 0
    max_score: int = 0
    passed: dict[str, int] = field(default_factory=dict)       # check -> passes
    pairs: Counter = field(default_factory=Counter)            # (a, b) -> fails
    scores: Counter = field(default_factory=Counter)           # score -> count

    def pass_rate(self, check: str) -> float:
        return self.passed[check] / self.n if self.n else 0.0


def collect(results: list[dict]) -> list[AssignmentStats]:
    """The statistics of each assignment among `results` (ledger results)."""
    by: dict[str, AssignmentStats] = {}
    for r in results:
        st = by.setdefault(r["assignment"], AssignmentStats(r["assignment"]))
        st.n += 1
        st.max_score = max(st.max_score, r["max_score"])
        st.scores[r["score"]] += 1
        for c in r["checks"]:
            st.passed[c["name"]] = st.passed.get(c["name"], 0) + bool(c["ok"])
        failed = sorted(c["name"] for c in r["checks"] if not c["ok"])
        st.pairs.update(combinations(failed, 2))
    return [by[k] for k in sorted(by)]


def _histogram(st: AssignmentStats) -> list[str]:
    top = max(st.scores.values())
    return [f"{score:>4}/{st.max_score:<4} {'#' * max(1, round(BAR * k / top))} {k}"
            for score, k in sorted(st.scores.items(), reverse=True)]


def markdown(stats: list[AssignmentStats], pairs: int = 5) -> str:
    """The report: a table of pass rates, the pairs, the histogram."""
    out = ["# Item statistics", ""]
    for st in stats:
        out += [f"## {st.name}: {st.n} submission(s), max {st.max_score}", "",
                "| check | passed | pass rate |", "|---|---:|---:|"]
        for check in sorted(st.passed, key=lambda c: (st.pass_rate(c), c)):
            out.append(f"| {check} | {st.passed[check]}/{st.n} | "
                       f"{st.pass_rate(check):.0%} |")
        common = [(p, k) for p, k in st.pairs.most_common(pairs) if k > 1]
        out += ["", "Most often failed together: " + (", ".join(
            f"{a} + {b} ({k})" for (a, b), k in common) or "no pair twice"), "",
            "Scores:", "", "```", *_histogram(st), "```", ""]
    return "\n".join(out)


def text(stats: list[AssignmentStats]) -> str:
    """The same, shorter, for the terminal: the lowest pass rates first."""
    lines = []
    for st in stats:
        worst = sorted(st.passed, key=lambda c: (st.pass_rate(c), c))[:5]
        lines += [f"{st.name}: pass rates (lowest first): " + ", ".join(
            f"{c} {st.pass_rate(c):.0%}" for c in worst)]
        common = [(p, k) for p, k in st.pairs.most_common(3) if k > 1]
        if common:
            lines.append("  failed together: " + ", ".join(
                f"{a} + {b} ({k})" for (a, b), k in common))
        lines += ["  " + line for line in _histogram(st)]
    return "\n".join(lines)


def write(path: Path, results: list[dict]) -> list[AssignmentStats]:
    stats = collect(results)
    Path(path).write_text(markdown(stats))
    return stats
