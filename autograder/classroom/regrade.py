"""What a change to the grader affects, and what a regrade changed.

A grade is recorded with the version of what decided it: the hash of every
file of the grader and the lab (`autograder/`, `handson/`) and of the
assignment's source notebook, leaving out the other assignments' own modules
and notebooks (no assignment module imports another). So a fix to
`claim_ack_reap.py` or to `solutions/claim_ack_reap/` regrades claim_ack_reap
only; a fix to shared code regrades everything. The files behind each version
are kept, so a regrade can say which changed, and per student which checks
moved (old -> new points) and why.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from autograder import assignments
from autograder.notebooks import notebook

SOURCES = ("autograder", "handson")


def manifest(assignment: str | None = None) -> dict[str, str]:
    """File -> content hash for everything that decides `assignment`'s grades
    (every assignment's, with None)."""
    others = {assignments.REGISTRY[n].replace(".", "/") + ".py"
              for n in assignments.names() if n != assignment} if assignment else set()
    files = {}
    for d in SOURCES:
        for p in sorted((notebook.REPO / d).rglob("*.py")):
            name = str(p.relative_to(notebook.REPO))
            if name not in others:
                files[name] = p
    pattern = f"{assignment}/*.ipynb" if assignment else "*/*.ipynb"
    for p in sorted(notebook.SOURCE_DIR.glob(pattern)):
        files["solutions/" + str(p.relative_to(notebook.SOURCE_DIR))] = p
    return {name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for name, p in files.items()}


def version(assignment: str | None = None) -> str:
    """A hash of `manifest(assignment)`: a grade made by another is out of date."""
    h = hashlib.sha256()
    for name, digest in sorted(manifest(assignment).items()):
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()[:16]


def changed_files(old: dict[str, str] | None, new: dict[str, str]) -> list[str]:
    if old is None:
        return []
    return sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))


@dataclass(frozen=True)
class CheckChange:
    name: str
    old: float
    new: float
    why: str


def _first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0][:160] if (text or "").strip() else ""


def diff(old: dict, new: dict) -> list[CheckChange]:
    """The checks whose points differ between two results of one submission."""
    before = {c["name"]: c for c in old["checks"]}
    after = {c["name"]: c for c in new["checks"]}
    out = []
    for name in [*after, *(n for n in before if n not in after)]:
        a, b = before.get(name), after.get(name)
        pa, pb = (a or {}).get("points", 0), (b or {}).get("points", 0)
        if a is not None and b is not None and pa == pb:
            continue
        if b is None:
            why = "no longer a check"
        elif a is None:
            why = "a new check"
        elif b["ok"] and not a["ok"]:
            was = _first_line(a.get("message")) or "failed"
            why = f"now passes (was: {was})"
        elif a["ok"] and not b["ok"]:
            why = "now fails: " + (_first_line(b.get("message")) or "failed")
        else:
            why = f"worth {b['max_points']:g} points now (was {a['max_points']:g})"
        out.append(CheckChange(name, pa, pb, why))
    return out


def describe(key: str, old: dict, new: dict, files: list[str]) -> str:
    """One student's regrade, for the report: score, checks, and the cause."""
    checks = diff(old, new)
    head = (f"{key}: {old['score']:g}/{old['max_score']:g} -> "
            f"{new['score']:g}/{new['max_score']:g}")
    lines = [head] + [f"    {c.name}: {c.old:g} -> {c.new:g}, {c.why}"
                      for c in checks]
    if files:
        shown = ", ".join(files[:4]) + (f" and {len(files) - 4} more"
                                        if len(files) > 4 else "")
        lines.append(f"    because {shown} changed")
    return "\n".join(lines)
