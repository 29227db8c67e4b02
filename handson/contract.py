"""The queue contract every queue in the course meets, and how to load one.

A queue is any module with these seven functions; the chaos run and the grader
use nothing else, so a queue with another key layout (or one on Redis Streams)
is judged on its behaviour alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

SIGNATURES = {
    "enqueue": ("r", "payload", "job_id"),
    "claim": ("r", "lease_s"),
    "ack": ("r", "job_id", "attempt"),
    "extend": ("r", "job_id", "attempt", "lease_s"),
    "fail": ("r", "job_id", "attempt", "error"),
    "reap": ("r", "max_attempts"),
    "dead": ("r",),
}


class ContractError(Exception):
    """A module that cannot be loaded, or lacks part of the contract."""


def load_queue(spec: str) -> ModuleType:
    """Import a queue by dotted name (`handson.q`) or by file path (`myq.py`)."""
    path = Path(spec)
    try:
        if spec.endswith(".py") or path.exists():
            if not path.is_file():
                raise ContractError(f"no queue module at {spec}")
            name = f"_queue_{abs(hash(str(path.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except ContractError:
        raise
    except SyntaxError as err:
        raise ContractError(f"{spec} has a syntax error on line {err.lineno}: "
                            f"{err.msg}") from None
    except Exception as err:  # the learner's import-time code is untrusted
        raise ContractError(f"importing {spec} raised {type(err).__name__}: {err}"
                            ) from None
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
