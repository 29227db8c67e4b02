"""Own work: a graded module must be the learner's code, not the course's.

Read with `ast` in the grader's process (the file is parsed, never imported).
A module file earns nothing for a check when:

- it imports anything from the course (`handson`, `autograder`, `solutions`,
  the tests' corpus, ...) beyond what its notebook hands out on purpose (the
  reference queue's other functions in heartbeats, `send_email` in
  idempotent_claims);
- a function the check needs is not defined with `def` at the top of the file
  (taken from elsewhere, or rebound after its def);
- it reaches for code the grader cannot see statically: `__import__`,
  `importlib`, `exec`, `eval`, `compile`, `runpy`, `sys.modules`, or opens a
  file of the course.

Each refusal is one line that says what was found and where.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from autograder.isolation import sandbox

COURSE = ("handson", "autograder", "solutions", "exercises", "tests", "book",
          "bugs")
DYNAMIC_MODULES = ("importlib", "runpy", "imp", "pkgutil", "zipimport", "builtins",
                   "marshal", "pickle", "code", "codeop")
DYNAMIC_NAMES = ("__import__", "exec", "eval", "compile", "__builtins__",
                 "__loader__", "__spec__")
COURSE_PATHS = ("handson", "solutions", "autograder", "exercises", "tests/",
                "site-packages")
QUEUE = ("enqueue", "claim", "ack", "extend", "fail", "reap", "dead")
# The reference queue's key names and limits: heartbeats builds on them.
Q_KEYS = ("TAG", "PENDING", "INFLIGHT", "JOBS", "WAITING", "DLQ", "DONE", "KEYS",
          "LEASE_EXPIRED", "DEFAULT_MAX_PENDING", "DEFAULT_DONE_TTL_S",
          "REAP_LIMIT", "QueueFull")


@dataclass(frozen=True)
class Policy:
    """What one assignment's module must define, and what it may import."""

    own: tuple[str, ...]                              # must be the learner's defs
    given: dict[str, tuple[str, ...]] = field(default_factory=dict)
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # check -> own

    def needed_by(self, check: str) -> tuple[str, ...]:
        return self.needs.get(check, self.own)


POLICIES = {
    "claim_ack_reap": Policy(own=QUEUE),
    "heartbeats": Policy(
        own=("extend", "run_with_heartbeat"),
        given={"handson.q": Q_KEYS + ("ack", "claim", "dead", "enqueue", "fail",
                                      "reap")},
        needs={"zombie_extend_refused": ("extend",),
               "extend_does_not_resurrect": ("extend",),
               "heartbeat_keeps_lease": ("extend",)}),
    "idempotent_claims": Policy(
        own=("claim", "read", "complete", "send_confirmation", "award_points"),
        given={"handson.confirmation_job": ("send_email",)}),
    "outbox_relay": Policy(own=("save_document", "relay_once", "summarize")),
    "pg_claim_finish": Policy(
        own=("claim", "finish"),
        given={"handson.queues.pgq": (
            "STATE_OUTSIDE_REDIS", "ack", "apply_effect", "conn", "dead", "effects",
            "enqueue", "extend", "fail", "reap", "redrive", "reset", "stats")}),
}


@dataclass
class Review:
    """What the file may not be graded for: problems for all, or per function."""

    everything: list[str] = field(default_factory=list)   # refuses every check
    functions: dict[str, str] = field(default_factory=dict)  # own name -> why

    def refusal(self, policy: Policy, check: str) -> str | None:
        """The line that zeroes this check, or None if it may be judged."""
        if self.everything:
            return self.everything[0]
        for name in policy.needed_by(check):
            if name in self.functions:
                return self.functions[name]
        return None


def _course_module(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in COURSE


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _imports(tree: ast.Module, policy: Policy, shown: str) -> list[str]:
    found = []
    for node in ast.walk(tree):
        line = f"{shown} line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if _course_module(alias.name):
                    found.append(f"{line} imports the course's module {alias.name}: "
                                 "graded work must be your own code")
                elif top in DYNAMIC_MODULES:
                    found.append(f"{line} imports {alias.name}, which loads code "
                                 "the grader cannot see: not allowed here")
        elif isinstance(node, ast.ImportFrom):
            mod = "." * node.level + (node.module or "")
            top = (node.module or "").split(".")[0]
            if node.level:
                found.append(f"{line} has a relative import (from {mod}): graded "
                             "work must be one self-contained file")
            elif _course_module(node.module):
                allowed = policy.given.get(node.module, ())
                extra = [a.name for a in node.names if a.name not in allowed]
                if extra:
                    what = ", ".join(extra)
                    found.append(f"{line} imports {what} from {node.module}, the "
                                 "course's own code: graded work must be yours"
                                 + (f" (only {', '.join(allowed)} may be imported "
                                    f"from it)" if allowed else ""))
            elif top in DYNAMIC_MODULES:
                found.append(f"{line} imports from {node.module}, which loads code "
                             "the grader cannot see: not allowed here")
    return found


def _dynamic(tree: ast.Module, shown: str) -> list[str]:
    found = []
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                  and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        line = f"{shown} line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id in DYNAMIC_NAMES:
            found.append(f"{line} uses {node.id}, which runs code the grader cannot "
                         "see: not allowed in graded work")
        elif isinstance(node, ast.Attribute) and _dotted(node) in (
                "sys.modules", "sys.path", "sys.meta_path", "sys.path_hooks"):
            found.append(f"{line} touches {_dotted(node)}, which changes what gets "
                         "imported: not allowed in graded work")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            low = node.value.replace("\\", "/")
            if any(p in low for p in ("solutions/", "handson/", "autograder/",
                                      "site-packages")) or low.endswith(
                    ("handson", "solutions", "autograder")):
                found.append(f"{line} names a file or folder of the course "
                             f"({node.value[:60]!r}): graded work may not read "
                             "the course's code")
    return found


def _top_level_bindings(tree: ast.Module) -> dict[str, ast.AST]:
    """Each top-level name -> the last statement that binds it."""
    last: dict[str, ast.AST] = {}

    def bind(target, stmt):
        for n in ast.walk(target):
            if isinstance(n, ast.Name):
                last[n.id] = stmt

    def record(n):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            last[n.name] = n
        elif isinstance(n, ast.Import | ast.ImportFrom):
            for a in n.names:
                last[(a.asname or a.name).split(".")[0]] = n
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                bind(t, n)
        elif isinstance(n, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
            bind(n.target, n)

    binds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import,
             ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign)
    for stmt in tree.body:
        if isinstance(stmt, binds):
            record(stmt)
        else:                              # if/try/for/with at top level
            for n in ast.walk(stmt):
                record(n)
    return last


def _functions(tree: ast.Module, policy: Policy, shown: str) -> dict[str, str]:
    bindings = _top_level_bindings(tree)
    why = {}
    for name in policy.own:
        stmt = bindings.get(name)
        if stmt is None:
            continue            # missing: the checks themselves say so
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            why[name] = (f"{shown} line {stmt.lineno}: {name} is not defined with "
                         f"def in {shown} (it is bound to something else); the "
                         "checks that use it need your own function")
            continue
        for node in ast.walk(stmt):
            rebound = [n for n in getattr(node, "names", ()) if n in policy.own]
            if isinstance(node, ast.Global) and rebound:
                why[name] = (f"{shown} line {node.lineno}: {name} rebinds "
                             f"{', '.join(rebound)} with global: graded functions "
                             "must stay as written")
    return why


def review(path: str, policy: Policy, shown: str) -> Review:
    """Parse the file and say what in it may not be graded (never imports it)."""
    try:
        with open(path, "rb") as fh:
            tree = sandbox.parse(fh.read(), filename=shown)
    except (OSError, SyntaxError, ValueError):
        return Review()                 # the probe reports it in the lab's words
    out = Review(everything=_imports(tree, policy, shown) + _dynamic(tree, shown))
    out.functions = _functions(tree, policy, shown)
    return out
