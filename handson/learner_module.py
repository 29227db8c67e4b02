"""Load a learner's module (a dotted name or a .py file) and say clearly what is wrong.

The lab's worker processes use this to run a learner's queue, job or relay in place of
the reference one; they are the only place that learner code runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


class ModuleProblem(Exception):
    """The module cannot be loaded or lacks a function the lab calls."""


def load(spec: str, required: tuple[str, ...] = ()) -> ModuleType:
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
