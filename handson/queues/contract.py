"""The queue contract every queue in the course meets, and how to load one.

A queue is any module with these seven functions; the chaos run and the grader
use nothing else, so a queue with another key layout (or one on Redis Streams)
is judged on its behaviour alone.

Time scales. A lease is from 0.1 s to 30 s and is kept to the millisecond of
the server's clock: a reap right after the claim leaves it alone, a reap 50 ms
after its end takes it back (`clocks.TOLERANCE`). An acked id stays one job
(enqueueing it again is a no-op) for as long as the queue keeps its done
marker; the checks re-enqueue it at once, the reference keeps it a day.
"""

from __future__ import annotations

import inspect
from types import ModuleType

from handson.infra import remote_module
from handson.infra.learner_module import ModuleProblem, load

SIGNATURES = {
    "enqueue": ("r", "payload", "job_id"),
    "claim": ("r", "lease_s"),
    "ack": ("r", "job_id", "attempt"),
    "extend": ("r", "job_id", "attempt", "lease_s"),
    "fail": ("r", "job_id", "attempt", "error"),
    "reap": ("r", "max_attempts"),
    "dead": ("r",),
}


class ContractError(ModuleProblem):
    """A module that cannot be loaded, or lacks part of the contract."""


def load_queue(spec: str) -> ModuleType:
    """Import a queue by dotted name (`handson.q`) or by file path (`myq.py`).

    Under the grader (EO_LEARNER_PREFIX set) the module runs in a process of
    its own and this returns a proxy for it: the caller imports no learner code.
    The course's own queues (`handson.…` by dotted name, never a file: the
    grader names learners' modules by path) are trusted and imported.
    """
    try:
        prefix = remote_module.prefix_from_env()
        own = spec.startswith("handson.") and not spec.endswith(".py")
        module = (load(spec) if prefix is None or own
                  else remote_module.load(spec, prefix))
    except ModuleProblem as err:
        raise ContractError(str(err)) from None
    problems = missing(module)
    if problems:
        raise ContractError(f"{spec} does not meet the queue contract: "
                            + "; ".join(problems))
    return module


def missing(module: ModuleType) -> list[str]:
    """What the module lacks: absent functions or ones with too few parameters."""
    problems = []
    for name, params in SIGNATURES.items():
        fn = getattr(module, name, None)
        if not callable(fn):
            problems.append(f"no function {name}()")
            continue
        try:
            n = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            continue
        required = len(params) - (1 if name in ("enqueue", "reap") else 0)
        if n < required:
            problems.append(f"{name}() takes {n} parameters, the contract passes "
                            f"{', '.join(params)}")
    return problems
