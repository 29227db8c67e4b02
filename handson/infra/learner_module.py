"""Load a learner's module (a dotted name or a .py file) and say clearly what is wrong.

The lab's worker processes use this to run a learner's queue, job or relay in place of
the reference one; they are the only place that learner code runs.

EO_CLOCK_SKEW_S=seconds sets this process's wall clock that far off before the
module is run (time.time, time.time_ns, datetime.now/utcnow/today): a check
can then run the learner's code on a machine whose clock is wrong, as a
worker's often is, to see whether its deadlines come from the server's clock.
Monotonic clocks and sleeps are left alone.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType

SKEW_ENV = "EO_CLOCK_SKEW_S"
_SKEWED: list[float] = []


class ModuleProblem(Exception):
    """The module cannot be loaded or lacks a function the lab calls."""


def skew_clock() -> float:
    """Apply EO_CLOCK_SKEW_S to this process's wall clock, once; the skew in s."""
    if _SKEWED:
        return _SKEWED[0]
    raw = os.environ.get(SKEW_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        skew = float(raw)
    except ValueError:
        raise ModuleProblem(f"{SKEW_ENV}={raw!r} is not a number of seconds"
                            ) from None
    _SKEWED.append(skew)
    apply_skew(skew)
    return skew


def apply_skew(skew: float) -> None:
    """This process's wall clock `skew` s off: time.time, time.time_ns and
    datetime's now/utcnow/today, for code that imports datetime afterwards
    (`from datetime import datetime` included); code imported before keeps
    the true clock. Monotonic clocks and sleeps are left alone."""
    if not skew:
        return
    real_time, real_ns = time.time, time.time_ns
    shift = datetime.timedelta(seconds=skew)
    time.time = lambda: real_time() + skew
    time.time_ns = lambda: real_ns() + round(skew * 1e9)

    class SkewedDatetime(datetime.datetime):
        __slots__ = ()      # the size C extensions (psycopg's) check on import

        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + shift

        @classmethod
        def utcnow(cls):
            return super().utcnow() + shift

        @classmethod
        def today(cls):
            return super().today() + shift

    class SkewedDate(datetime.date):
        __slots__ = ()

        @classmethod
        def today(cls):
            return SkewedDatetime.now().date()

    datetime.datetime, datetime.date = SkewedDatetime, SkewedDate


def load(spec: str, required: tuple[str, ...] = ()) -> ModuleType:
    skew_clock()
    path = Path(spec)
    try:
        if spec.endswith(".py") or path.exists():
            if not path.is_file():
                raise ModuleProblem(f"no module at {spec}")
            name = f"_learner_{abs(hash(str(path.resolve())))}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(spec)
    except ModuleProblem:
        raise
    except SyntaxError as err:
        raise ModuleProblem(f"{spec} has a syntax error on line {err.lineno}: "
                            f"{err.msg}") from None
    except Exception as err:  # the learner's import-time code is untrusted
        raise ModuleProblem(f"importing {spec} raised {type(err).__name__}: "
                            f"{err}") from None
    lacking = [f for f in required if not hasattr(module, f)]
    if lacking:
        raise ModuleProblem(f"{spec} defines no {', '.join(lacking)}")
    return module
