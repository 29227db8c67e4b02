"""The term's rules an export needs: due dates and the late policy.

They live where an nbgrader instructor already configures the course, in
`nbgrader_config.py`, as a section of their own (nbgrader ignores it):

    c.Term.due = {"claim_ack_reap": "2026-10-12 23:59:00 UTC"}
    c.Term.late_penalty_per_day = 0.1    # of the points, per day or part late
    c.Term.canvas_assignment_ids = {"claim_ack_reap": 12345}   # Canvas's ids

A submission's time is nbgrader's `submitted/<student>/<assignment>/
timestamp.txt` (what `nbgrader collect` writes). No due date, no timestamp or
a penalty of 0 means no late penalty. The penalty never takes more than the
score (as nbgrader's own late penalties).

`canvas_assignment_ids` gives, per assignment, the id Canvas shows in the
assignment's address (`.../assignments/12345`): Canvas's gradebook import
matches a column to an assignment by the "name (id)" in its header, so with an
id the export's column goes straight to that assignment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

DAY_S = 86400.0


class TermError(Exception):
    """The course config's term section cannot be used (one line says why)."""


@dataclass(frozen=True)
class Term:
    due: dict[str, datetime] = field(default_factory=dict)   # naive UTC
    late_penalty_per_day: float = 0.0
    canvas_ids: dict[str, int] = field(default_factory=dict)  # name -> Canvas id


@dataclass(frozen=True)
class Late:
    """How late a submission was and what it costs."""

    days: int = 0              # days or parts of a day after the due date
    penalty: float = 0.0       # points off
    text: str = ""             # for feedback; "" when on time


def _utc(value, where: str) -> datetime:
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(value)
    except Exception:  # noqa: BLE001 - dateutil raises several kinds
        raise TermError(f"{where}: {value!r} is not a date and time (e.g. "
                        "'2026-10-12 23:59:00 UTC')") from None


def _an_id(value) -> bool:
    """A Canvas id: a positive whole number, or its digits as a string."""
    if isinstance(value, str):
        return value.isdigit() and int(value) > 0
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def load(course: Path) -> Term:
    """The term section of `course/nbgrader_config.py`; none there: no rules."""
    path = Path(course) / "nbgrader_config.py"
    if not path.is_file():
        return Term()
    from traitlets.config.loader import PyFileConfigLoader

    section = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    section = section.get("Term", {})
    due = section.get("due", {})
    rate = section.get("late_penalty_per_day", 0.0)
    if not isinstance(due, dict):
        raise TermError(f"{path}: c.Term.due must map assignment names to dates")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not (
            0 <= rate <= 1):
        raise TermError(f"{path}: c.Term.late_penalty_per_day must be a fraction "
                        f"of the points between 0 and 1, not {rate!r}")
    ids = section.get("canvas_assignment_ids", {})
    if not isinstance(ids, dict) or not all(_an_id(v) for v in ids.values()):
        raise TermError(f"{path}: c.Term.canvas_assignment_ids must map assignment "
                        "names to Canvas's assignment ids (the number in the "
                        f"assignment's address), not {ids!r}")
    return Term({name: _utc(when, f"{path}: c.Term.due[{name!r}]")
                 for name, when in due.items()}, float(rate),
                {name: int(v) for name, v in ids.items()})


def submitted_at(folder: Path) -> datetime | None:
    """nbgrader's timestamp.txt in a submission folder, as naive UTC."""
    stamp = Path(folder) / "timestamp.txt"
    if not stamp.is_file():
        return None
    return _utc(stamp.read_text().strip(), str(stamp))


def late(term: Term, assignment: str, when: datetime | None, score: float,
         max_score: float) -> Late:
    """The late penalty for a submission made `when`, scoring `score`."""
    due = term.due.get(assignment)
    if due is None or when is None or when <= due:
        return Late()
    days = math.ceil((when - due).total_seconds() / DAY_S)
    said = f"submitted {days} day(s) late (due {due:%Y-%m-%d %H:%M} UTC)"
    if term.late_penalty_per_day <= 0:
        return Late(days, 0.0, said + "; no late penalty")
    penalty = round(min(score, days * term.late_penalty_per_day * max_score), 2)
    return Late(days, penalty, (
        f"{said}: {term.late_penalty_per_day:.0%} of the points a day, "
        f"-{penalty:g} points, {score - penalty:g}/{max_score:g} counts"))
