"""The assignments the grader knows: name -> the module that grades it.

Each module holds `NAME`, `CHECKS` (name, points, title; the names are the
grade cells' ids), `NOTEBOOK_TIMEOUT_S`, `OBSERVE_CELL` (code the grader appends
to the learner's cells, or None) and `evaluate(workdir, redis_url, quick)`.
See autograder/README.md for how to add one.
"""

from __future__ import annotations

import importlib
from types import ModuleType

REGISTRY = {
    "delivery_semantics": "autograder.judges.delivery_semantics",
    "claim_ack_reap": "autograder.judges.claim_ack_reap",
    "heartbeats": "autograder.judges.heartbeats",
    "idempotent_claims": "autograder.judges.idempotent_claims",
    "outbox_relay": "autograder.judges.outbox_relay",
    "pg_claim_finish": "autograder.judges.pg_claim_finish",
}


def names() -> list[str]:
    return list(REGISTRY)


def load(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise KeyError(f"unknown assignment {name!r}; known: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name])


def points(name: str) -> dict[str, int]:
    """Check name -> points: what the grade cells' nbgrader metadata must say."""
    return {c.name: c.points for c in load(name).CHECKS}
