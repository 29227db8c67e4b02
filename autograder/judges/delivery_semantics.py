"""Assignment 1, delivery_semantics: the c01 page's designs, rebuilt by the learner.

The learner defines, in the notebook:

    ack_before_work(jobs) -> Sink        ack_after_work(jobs) -> Sink
    dedup_key(job_id, attempt)           the key both dedup designs use
    dedup_outside_tx(jobs) -> Sink       effect, then key: two writes
    dedup_in_tx(jobs) -> Sink            key and effect in one step
    window_escapes(window, max_delay=2000, seed=17) -> int
    lease_doubles(lease_s, n=20_000, seed=31) -> int

The expected numbers are not typed here: `reference()` takes them from
`handson.c01_job_scheduler` at grade time (the rows its blocks print, and its
`lease_doubles`), so the grader and the page cannot disagree. A second crash
stream (full grading only) is judged by the page's claims, not by numbers, so
a submission cannot pass by printing the page's table.

Each function is also called again, as a long-running worker calls it: every
design twice on one short stream of new jobs, some delivered again after their
own delivery ran or crashed (the dedups must refuse them, and the second call
must find no state the first one left); window_escapes and lease_doubles once
more with arguments they already had, and once with a seed (an n) the page's
table never varies, judged by the page's own function run with it. The grader
(not a kernel, which is one process) starts a fresh host, a new interpreter
with its own hash seed and random state, as the redelivery's worker: it asks
for dedup_key(j, 2), first of a job no host keyed, then backwards, and
compares each with attempt 1's key from the first host.

`evaluate_file` grades a module that defines the functions (MODULE_FILE: the
notebook's cells as `cells_module` writes them, or a corpus module) through
that one sandboxed harness; `evaluate` writes the notebook's cells there. The
calls and what they saw are `delivery_observe`'s; this module judges them.
"""

from __future__ import annotations

import functools
import io
import json
import re
import sys
import threading
import time
from pathlib import Path

from autograder.judges.checks import (
    Check,
    Evaluation,
    cached,
    cached_only,
    notebook_check,
    notebook_summary,
    outcome,
)
from autograder.judges.delivery_observe import (
    ALT_CRASH,
    ALT_DELAY,
    ALT_LEASE_N,
    ALT_LEASES,
    ALT_N,
    ALT_SEED,
    ALT_WINDOWS,
    CALL_LIMIT_S,
    DESIGNS,
    LEASES,
    N_LEASE,
    QUICK_LEASES,
    QUICK_WINDOWS,
    SEED_WINDOW,
    WINDOWS,
    _TimeLimit,
    observe,
    redeliveries,
)

NAME = "delivery_semantics"
CHECKS = [
    Check("ack_before_work", 2, "ack before work loses the crashed jobs, silently"),
    Check("ack_after_work", 2, "ack after work loses nothing, doubles the same jobs"),
    Check("dedup_key_stable", 1, "the dedup key is the same on every attempt"),
    Check("dedup_outside_tx", 2, "a key written after the effect catches nothing"),
    Check("dedup_in_tx", 2, "key and effect in one step: 0 lost, 0 doubled"),
    Check("window_escapes", 3, "a bounded window leaks until it reaches the max delay"),
    Check("lease_doubles", 2, "without renewal, jobs longer than the lease run twice"),
]
ROWS = {"ack_before_work": "at-most-once", "ack_after_work": "at-least-once",
        "dedup_outside_tx": "dedup, non-transactional",
        "dedup_in_tx": "dedup, transactional"}


# --- the reference: numbers computed by handson.c01_job_scheduler -------------

_REFERENCE_LOCK = threading.Lock()


def reference() -> dict:
    """The page's numbers, from the page's script, now (once per process)."""
    with _REFERENCE_LOCK:
        return _reference()


@functools.lru_cache(maxsize=1)
def _reference() -> dict:
    from handson import c01_job_scheduler as c01

    # The script's own prints, read through its module's `print`: swapping
    # sys.stdout would take every thread's (a line the corpus command printed
    # meanwhile was lost so), and free what a print in flight still used.
    out = io.StringIO()
    c01.print = functools.partial(print, file=out)
    try:
        s = c01.collect(upto=4, show=True)
        c01.assembly(s)
    finally:
        del c01.print
    text = out.getvalue()
    rows = {}
    for design, label in ROWS.items():
        m = re.search(rf"^\s+{re.escape(label)}\s+(\d+)\s+(\d+)\s+(\d+)\s+(yes|no)$",
                      text, re.M)
        if not m:
            raise RuntimeError(f"the c01 assembly no longer prints a row '{label}'")
        rows[design] = tuple(int(x) for x in m.groups()[:3])
    windows = {int(w.replace(",", "")): int(d) for w, d in re.findall(
        r"^\s+([\d,]+)\s+\d+ KB\s+(\d+)\s+[\d.]+%$", text, re.M)}
    if set(windows) != set(WINDOWS):
        raise RuntimeError("the c01 block 4 table no longer lists windows "
                           f"{WINDOWS}; found {sorted(windows)}")
    page = c01.stream()
    alt = c01.stream(ALT_N, ALT_CRASH)
    leases = {(t, 31): c01.lease_doubles(t, seed=31) for t in LEASES}
    leases.update({(t, ALT_SEED): c01.lease_doubles(t, seed=ALT_SEED)
                   for t in ALT_LEASES})
    short_n = c01.lease_doubles(N_LEASE, n=ALT_LEASE_N, seed=31)
    sink, _ = c01.late_redelivery(SEED_WINDOW, delay_seed=ALT_SEED)
    return {"rows": rows, "windows": windows, "leases": leases, "n": c01.N,
            "window_seed": sink.stats(c01.N)[2], "lease_n": short_n,
            "crashed": {"page": sorted(j for j, c in page if c),
                        "alt": sorted(j for j, c in alt if c)}}


# --- judging: trusted, pure ---------------------------------------------------

def _ids(ids: list[int], k: int = 5) -> str:
    head = ", ".join(map(str, ids[:k]))
    return f"[{head}{', ...' if len(ids) > k else ''}] ({len(ids)} jobs)"


def _design(check: Check, obs: dict, ref: dict, quick: bool):
    name = check.name
    lost_exp, once_exp, dup_exp = ref["rows"][name]
    page = obs.get(f"{name}:page", {"error": f"{name}() was not run"})
    if "error" in page:
        return outcome(check, False, page["error"])
    got = (len(page["lost"]), page["once"], len(page["dup"]))
    crashed = ref["crashed"]["page"]
    exp_text = f"lost={lost_exp}, once={once_exp}, duplicated={dup_exp}"
    got_text = f"lost={got[0]}, once={got[1]}, duplicated={got[2]}"
    hints = {
        "ack_before_work": "With the ack first, the queue forgets the job before the "
                           "work; a crash means the effect never happens and nothing "
                           "redelivers it. Apply only the jobs whose worker survived, "
                           "once.",
        "ack_after_work": "With the ack after the work, a crash lands between the "
                          "effect and the ack, so the job is redelivered and the "
                          "effect happens again: apply every job, and the crashed "
                          "ones a second time.",
        "dedup_outside_tx": "Apply the effect, then record the key as a separate "
                            "write; the crash lands between them, so the redelivery "
                            "finds no key and applies again.",
        "dedup_in_tx": "Record the key and apply the effect together (both or "
                       "neither): a crash before the commit leaves neither, and the "
                       "redelivery finds the key only if the effect happened.",
    }
    if got != (lost_exp, once_exp, dup_exp):
        extra = ""
        if name == "dedup_in_tx" and got[2] == len(crashed):
            extra = (" Every crashed job was applied twice: either the key and the "
                     "effect are two writes with the crash between them, or the key "
                     "changes between attempts (see dedup_key_stable).")
        return outcome(check, False, hints[name] + extra, exp_text, got_text)
    if name in ("ack_before_work",) and page["lost"] != crashed:
        return outcome(check, False, "The right number of jobs was lost, but not "
                       "the jobs whose worker crashed.", _ids(crashed),
                       _ids(page["lost"]))
    if name in ("ack_after_work", "dedup_outside_tx") and page["dup"] != crashed:
        return outcome(check, False, "The doubled jobs must be exactly the ones whose "
                       "worker crashed: the same crash window as ack-before-work.",
                       _ids(crashed), _ids(page["dup"]))
    short = _short(check, obs)
    if short is not None:
        return short
    if quick:
        return outcome(check, True)
    alt = obs.get(f"{name}:alt", {"error": f"{name}() was not run on a second stream"})
    if "error" in alt:
        return outcome(check, False, "On a second crash stream: " + alt["error"])
    crashed_alt = ref["crashed"]["alt"]
    want = {"ack_before_work": (crashed_alt, []), "ack_after_work": ([], crashed_alt),
            "dedup_outside_tx": ([], crashed_alt), "dedup_in_tx": ([], [])}[name]
    if (alt["lost"], alt["dup"]) != want:
        return outcome(check, False,
                       f"On a second stream ({ALT_N:,} jobs, {ALT_CRASH:.0%} "
                       "crashes) the page's claim does not hold; is the page's "
                       "number typed in instead of computed from `jobs`? "
                       + hints[name],
                       f"lost {_ids(want[0])}, duplicated {_ids(want[1])}",
                       f"lost {_ids(alt['lost'])}, duplicated {_ids(alt['dup'])}")
    return outcome(check, True)


def _short_want(name: str, jobs: list[tuple[int, bool]]) -> dict[str, int]:
    """The page's claim for each job of the short stream: times applied."""
    first: dict[str, bool] = {}
    want: dict[str, int] = {}
    for j, crashes in jobs:
        first.setdefault(str(j), crashes)
        runs = {"ack_before_work": 0 if crashes else 1,
                "ack_after_work": 2 if crashes else 1}.get(name, 0)
        want[str(j)] = want.get(str(j), 0) + runs
    if name == "dedup_outside_tx":     # the crash between effect and key, once
        want = {j: 2 if crashed else 1 for j, crashed in first.items()}
    if name == "dedup_in_tx":
        want = dict.fromkeys(first, 1)
    return want


def _deliveries(j: str, jobs: list[tuple[int, bool]]) -> str:
    said = ["crashed" if c else "ran" for k, c in jobs if str(k) == j]
    return ", then ".join(f"delivery {i + 1} {w}" for i, w in enumerate(said))


SHORT_HINTS = {
    "ack_before_work": "Every delivery acks first: one that crashes applies "
                       "nothing, one that runs applies once, however many came "
                       "before.",
    "ack_after_work": "Every delivery applies its effect; one that crashes is "
                      "redelivered at once and applies it again.",
    "dedup_outside_tx": "The key the first delivery recorded (after its effect) "
                        "must refuse every later delivery of the job: look the "
                        "key up before the effect, whatever `crashes` says.",
    "dedup_in_tx": "The key committed with the effect must refuse every later "
                   "delivery of the job: look the key up before the effect; "
                   "the `crashes` flag alone cannot tell a redelivery.",
}


def _short(check: Check, obs: dict):
    """The short stream, called twice: None when both calls keep the claim."""
    name = check.name
    jobs = redeliveries()
    first, again = (obs.get(f"{name}:{k}", {"error": f"{name}() was not run on "
                                            "the short stream"})
                    for k in ("short", "again"))
    for res in (first, again):
        if "error" in res:
            return outcome(check, False, "On a short stream of new jobs: "
                           + res["error"])
    if again["applied"] != first["applied"]:
        j = next(k for k in first["applied"]
                 if first["applied"][k] != again["applied"][k])
        return outcome(check, False,
                       f"{name}() called a second time in the same process, on "
                       f"the same {len(jobs)} deliveries (as a long-running "
                       "worker takes its next batch), after its first call had "
                       f"applied job {j} {first['applied'][j]} time(s): the "
                       "first call's state outlived it (a Sink, a key set or a "
                       "counter kept at module level?). Make them inside the "
                       "function, so each call starts empty.",
                       f"second call: job {j} applied {first['applied'][j]} "
                       "time(s), as in the first",
                       f"second call: job {j} applied {again['applied'][j]} "
                       "time(s)")
    want = _short_want(name, jobs)
    for j, n in want.items():
        got = first["applied"].get(j, 0)
        if got == n:
            continue
        seen = _deliveries(j, jobs)
        step = ("delivered again after its own "
                + ("crashed" if seen.startswith("delivery 1 crashed")
                   else "successful") + " delivery" if "delivery 2" in seen
                else "delivered once")
        return outcome(check, False,
                       f"On a short stream of new jobs, job {j} was {step} "
                       f"({seen}), as a broker redelivers a job whose ack it "
                       f"never got: {name}() applied it {got} time(s). "
                       + SHORT_HINTS[name],
                       f"job {j} applied {n} time(s)",
                       f"job {j} ({seen}) applied {got} time(s)")
    return None


def _keys(check: Check, obs: dict):
    k = obs.get("dedup_key", {"error": "dedup_key() was not run"})
    if "error" in k:
        return outcome(check, False, k["error"])
    for j, pair in k["pairs"].items():
        if not pair["same"]:
            return outcome(check, False,
                           "The key changes between attempts, so a redelivery "
                           "(attempt 2) never finds the key attempt 1 wrote and the "
                           "dedup does nothing. Build the key from what is stable "
                           "across deliveries (the job id), never from the attempt "
                           "number, a timestamp or a fresh uuid.",
                           f"dedup_key({j}, 1) == dedup_key({j}, 2)",
                           f"{pair['a1']} != {pair['a2']}")
    if not k["distinct"]:
        return outcome(check, False, "Different jobs get the same key, so the dedup "
                       "would drop real work.", "distinct keys for jobs 0, 7, 123",
                       "some are equal")
    fresh = obs.get("dedup_key:fresh",
                    {"error": "dedup_key() was not run in a fresh worker process"})
    if "error" in fresh:
        return outcome(check, False, fresh["error"])
    for j, res in fresh.get("keys", {}).items():
        if "error" in res:
            return outcome(check, False, "In a fresh worker process: "
                           + res["error"])
        if res["a2"] != k["pairs"][j]["a1"]:
            return outcome(check, False,
                           f"dedup_key({j}, 2) was computed in a fresh worker "
                           "process (the redelivery's worker: another "
                           "interpreter, with its own hash seed and random "
                           "state, that met the jobs in another order) while "
                           f"the worker of attempt 1 had computed "
                           f"dedup_key({j}, 1): the keys differ, so the "
                           "redelivery finds no key. The key depends on "
                           "something one process kept or drew (a cache, a "
                           "counter, a uuid or random draw, hash() of a "
                           "string); build it from the job id alone.",
                           f"dedup_key({j}, 2) == {k['pairs'][j]['a1']}",
                           f"{res['a2']} (fresh worker) != "
                           f"{k['pairs'][j]['a1']} (attempt 1's worker)")
    return outcome(check, True)


def _rows(obs: dict, cases: list[tuple[str, str, object]],
          missing: str) -> tuple[list[str], list[str]] | str:
    """(expected rows, observed rows) for the cases, or the first error."""
    exp, got = [], []
    for key, label, want in cases:
        res = obs.get(key, {"error": missing})
        if "error" in res:
            return res["error"]
        exp.append(f"{label}{want}")
        got.append(f"{label}{res['value']}")
    return exp, got


def _repeated(check: Check, obs: dict, key: str, call: str):
    """The same call made again at the end, in the same process: None when it
    returned what the first one did."""
    first, again = obs.get(key, {}), obs.get(f"{key}:again", {})
    if "value" not in first or "value" not in again:
        return None if "error" in first else outcome(
            check, False, f"{call} called again (the same arguments, in the "
            "same process, after the other calls), where the first call "
            f"returned {first.get('value')}: "
            + again.get("error", "it was not run again"))
    if again["value"] == first["value"]:
        return None
    return outcome(check, False,
                   f"{call} called again with the same arguments in the same "
                   "process, after the other calls, returned another number: "
                   "state outlived the first call (a random.Random, a set or a "
                   "list kept at module level?). Make each inside the "
                   "function, from its arguments.",
                   f"{first['value']}, as the first call",
                   f"{again['value']} on the call again")


def _windows(check: Check, obs: dict, ref: dict, quick: bool):
    w0 = (QUICK_WINDOWS if quick else WINDOWS)[0]
    again = _repeated(check, obs, f"window:{w0}:2000",
                      f"window_escapes({w0}, 2000, 17)")
    if again is not None:
        return again
    rows = _rows(obs, [(f"window:{w}:2000", f"{w}:", ref["windows"][w])
                       for w in (QUICK_WINDOWS if quick else WINDOWS)],
                 "window_escapes() was not run")
    if isinstance(rows, str):
        return outcome(check, False, rows)
    rows_exp, rows_got = rows
    if rows_exp != rows_got:
        return outcome(check, False,
                       "Escapes per window (max delay 2000, seed 17) differ from the "
                       "page. Each crashed job is redelivered rng.randint(1, "
                       "max_delay) jobs later; the dedup set keeps the last `window` "
                       "ids (evict the oldest); count jobs applied more than once.",
                       ", ".join(rows_exp), ", ".join(rows_got))
    if not quick:
        got = {w: obs.get(f"window:{w}:{ALT_DELAY}", {}) for w in ALT_WINDOWS}
        bad = [w for w, g in got.items() if "value" not in g]
        if bad:
            return outcome(check, False, got[bad[0]].get("error", "not run"))
        small, exact = got[ALT_WINDOWS[0]]["value"], got[ALT_WINDOWS[1]]["value"]
        if not (small > 0 and exact == 0):
            return outcome(check, False,
                           f"With max_delay={ALT_DELAY} the claim is that a window "
                           "below the max delay leaks and a window at it leaks "
                           "nothing; does window_escapes use its max_delay argument?",
                           f"window {ALT_WINDOWS[0]}: > 0, window {ALT_WINDOWS[1]}: 0",
                           f"window {ALT_WINDOWS[0]}: {small}, "
                           f"window {ALT_WINDOWS[1]}: {exact}")
        return _other_arg(check, obs, f"window:{SEED_WINDOW}:2000:{ALT_SEED}",
                          f"window_escapes({SEED_WINDOW}, 2000, seed={ALT_SEED})",
                          ref["window_seed"], "the page's late_redelivery with "
                          f"delay seed {ALT_SEED}: the delays do not come from "
                          "`seed` (a fixed seed?). Seed one random.Random with "
                          "`seed` inside the call.")
    return outcome(check, True)


def _other_arg(check: Check, obs: dict, key: str, call: str, want: int,
               why: str):
    """One call with an argument the page's table never varies, judged by
    the page's own function run with it at grade time."""
    res = obs.get(key, {"error": f"{call} was not run"})
    if "error" in res:
        return outcome(check, False, res["error"])
    if res["value"] != want:
        return outcome(check, False, f"{call} differs from {why}", str(want),
                       str(res["value"]))
    return outcome(check, True)


def _leases(check: Check, obs: dict, ref: dict, quick: bool):
    again = _repeated(check, obs, f"lease:{LEASES[0]}:31",
                      f"lease_doubles({LEASES[0]}, 20000, 31)")
    if again is not None:
        return again
    cases = [(t, 31) for t in (QUICK_LEASES if quick else LEASES)]
    if not quick:
        cases += [(t, ALT_SEED) for t in ALT_LEASES]
    rows = _rows(obs, [(f"lease:{t}:{seed}", f"{t}s/seed {seed}: ",
                        ref["leases"][(t, seed)]) for t, seed in cases],
                 "lease_doubles() was not run")
    if isinstance(rows, str):
        return outcome(check, False, rows)
    exp, got = rows
    page = sum(1 for _, seed in cases if seed == 31)
    if exp[:page] == got[:page] and exp != got:
        return outcome(check, False,
                       f"With seed 31 every number is the page's; with seed "
                       f"{ALT_SEED} they are not: the durations do not come "
                       "from the seed passed in (a fixed seed, or an rng made "
                       "once at module level?). Seed one random.Random with "
                       "`seed` inside the call.", "; ".join(exp[page:]),
                       "; ".join(got[page:]))
    if exp != got:
        return outcome(check, False,
                       "Draw each job's duration as the page does (95%: "
                       "expovariate(1/2), 5%: expovariate(1/40), one rng seeded "
                       "with `seed`); without renewal a job longer than the lease "
                       "is redelivered and runs twice.", "; ".join(exp),
                       "; ".join(got))
    if quick:
        return outcome(check, True)
    return _other_arg(check, obs, f"lease:{N_LEASE}:31:{ALT_LEASE_N}",
                      f"lease_doubles({N_LEASE}, n={ALT_LEASE_N}, seed=31)",
                      ref["lease_n"], f"the page's lease_doubles over "
                      f"{ALT_LEASE_N:,} jobs: does it draw `n` jobs, not a "
                      "fixed count?")


def judge(obs: dict, quick: bool = False) -> list:
    ref = reference()
    by = {c.name: c for c in CHECKS}
    out = [_design(by[d], obs, ref, quick) for d in
           ("ack_before_work", "ack_after_work")]
    out.append(_keys(by["dedup_key_stable"], obs))
    out += [_design(by[d], obs, ref, quick) for d in ("dedup_outside_tx",
                                                       "dedup_in_tx")]
    out.append(_windows(by["window_escapes"], obs, ref, quick))
    out.append(_leases(by["lease_doubles"], obs, ref, quick))
    return out


# --- the notebook side --------------------------------------------------------

def _fingerprint(ns: dict) -> tuple:
    names = DESIGNS + ("dedup_key", "window_escapes", "lease_doubles")
    return tuple((n, id(ns.get(n)), id(getattr(ns.get(n), "__code__", None)))
                 for n in names)


def _caller_ns() -> dict:
    return sys._getframe(2).f_globals


def check(name: str) -> None:
    """A grade cell: full observation (once per kernel), then this one check."""
    ns = _caller_ns()
    key = ("delivery_semantics", False, _fingerprint(ns))
    outcomes = cached(key, lambda: judge(observe(ns)))
    notebook_check(outcomes, name)


def check_all() -> bool:
    """The learner's check cell: the page's stream only; first failure in full."""
    ns = _caller_ns()
    start = time.monotonic()
    outcomes = cached_only(("delivery_semantics", False, _fingerprint(ns)))
    reused = outcomes is not None
    outcomes = outcomes or judge(observe(ns, quick=True), quick=True)
    ok = notebook_summary(outcomes, reused)
    if not reused:
        print(f"  (quick run: {time.monotonic() - start:.1f} s)")
    return ok


# --- the grader side ------------------------------------------------------------
#
# The observation never runs in the learner's kernel: after the notebook ran
# (for its own errors and leftovers), the learner's code cells are written to a
# module that re-runs them, cell by cell, in a sandboxed host process, and a
# trusted harness (`python -m autograder.judges.delivery_semantics`, which imports no
# learner code) calls the functions over the pipe and prints what they returned.

NOTEBOOK_TIMEOUT_S = 300
MODULE_FILE = "learner_cells.py"     # the cells as a module, or a corpus module
OBSERVE_TIMEOUT_S = 300
# Course files the notebook imports on purpose.
IMPORTS = ("handson/__init__.py", "handson/c01_job_scheduler.py")


def cells_module(nb) -> str:
    """A module that runs the notebook's code cells in order, like a kernel:
    a cell that raises does not stop the next; magics and shell lines are
    dropped, a `%%writefile` cell is not code."""
    from autograder.notebooks import notebook

    sources = []
    for cell in notebook.learner_cells(nb).cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        sources.append("\n".join(line for line in cell.source.splitlines()
                                 if not line.lstrip().startswith(("%", "!"))))
    return ("import sys as _sys\n"
            f"_CELLS = {sources!r}\n"
            "for _i, _src in enumerate(_CELLS):\n"
            "    try:\n"
            "        exec(compile(_src, f'<cell {_i + 1}>', 'exec'), globals())\n"
            "    except BaseException as _err:\n"
            "        print(f'cell {_i + 1}: {type(_err).__name__}: {_err}',\n"
            "              file=_sys.stderr)\n")


class _Remote(dict):
    """observe()'s namespace: the learner's functions, called in their host."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def get(self, name, default=None):
        from handson.infra import remote_module

        if self.module_functions().get(name) is None:
            return default
        if name in self:
            return self[name]

        def call(*args):
            try:       # our own limit first: it stops the host (the alarm not)
                return self.module._call(name, args, {}, timeout=CALL_LIMIT_S - 1)
            except _TimeLimit:
                self.module._host.close()
                raise
            except remote_module.LearnerProcessDied as err:
                if "no answer" in str(err):
                    raise _TimeLimit(f"did not return within {CALL_LIMIT_S} s (an "
                                     "endless loop?)") from None
                raise
            except remote_module.LearnerError as err:
                if type(err).__name__ == "SystemExit":
                    code = str(err)
                    raise SystemExit(int(code) if code.lstrip("-").isdigit()
                                     else code or None) from None
                raise
        self[name] = call               # one callable per name: _call's _hung
        return call

    def module_functions(self) -> dict:
        return self.module._host.functions

    def fresh(self) -> str | None:
        """The next calls run in a new host, as a redelivery's other worker:
        started now, so its load is timed by the start limit, not by a call's;
        None, or why it could not load (the old host then stays)."""
        from handson.infra import remote_module

        try:
            self.module.restart(cold=True)
        except remote_module.ModuleProblem as err:
            return str(err)
        return None


def observe_remote(cells_path: str, quick: bool) -> dict:
    """The trusted harness: load the cells in a host, observe over the pipe."""
    from handson.infra import remote_module

    prefix = remote_module.prefix_from_env() or []
    try:
        module = remote_module.load(cells_path, prefix, "the notebook",
                                    cwd=str(Path(cells_path).parent))
    except remote_module.ModuleProblem as err:
        return {"__problem__": str(err)}
    try:
        return observe(_Remote(module), quick=quick)
    finally:
        module.close()


def evaluate_file(path: str, redis_url: str | None = None, quick: bool = False,
                  shown_path: str = MODULE_FILE) -> Evaluation:
    """The learner's functions in the module at `path` (the notebook's cells,
    or a module that defines them), observed by the trusted harness in the
    sandbox and judged."""
    from autograder.isolation import sandbox
    from autograder.judges import queue_runs

    problems: list[str] = []
    obs: dict = {}
    if Path(path).exists():
        fin = sandbox.run([sys.executable, "-m", "autograder.judges.delivery_semantics",
                           str(path), *(["--quick"] if quick else [])],
                          timeout=OBSERVE_TIMEOUT_S,
                          env=queue_runs.learner_env(str(path), None, IMPORTS))
        try:
            obs = json.loads(fin.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            why = (f"did not finish in {OBSERVE_TIMEOUT_S} s" if fin.timed_out
                   else f"ended without a report: {fin.tail(300)}")
            problems.append(f"the observation of your functions {why}")
        if "__problem__" in obs:
            problems.append(f"{shown_path} could not be loaded for the "
                            f"observation: {obs.pop('__problem__')}")
        if fin.leftovers:
            problems.append(f"the observation left {len(fin.leftovers)} "
                            "process(es) running (all killed): "
                            + "; ".join(fin.leftovers[:3]))
    missing = "the grader could not observe this function: the notebook stopped " \
              "before the observation ran (see the problems above)"
    for key in _expected_keys(quick):
        obs.setdefault(key, {"error": missing})
    return Evaluation(judge(obs, quick), problems)


def evaluate(workdir, redis_url: str, quick: bool) -> Evaluation:
    from autograder.notebooks import notebook

    src = Path(workdir) / "submission.ipynb"
    cells = Path(workdir) / MODULE_FILE
    if src.exists():
        cells.write_text(cells_module(notebook.read(src)))
    return evaluate_file(str(cells), redis_url, quick, "the notebook's cells")


def _expected_keys(quick: bool) -> list[str]:
    keys = [f"{d}:{k}" for d in DESIGNS for k in ("page", "short", "again")]
    keys += ["dedup_key", "dedup_key:fresh"]
    keys += [f"window:{w}:2000" for w in (QUICK_WINDOWS if quick else WINDOWS)]
    keys += [f"lease:{t}:31" for t in (QUICK_LEASES if quick else LEASES)]
    if not quick:
        keys += [f"{d}:alt" for d in DESIGNS]
        keys += [f"window:{w}:{ALT_DELAY}" for w in ALT_WINDOWS]
        keys += [f"lease:{t}:{ALT_SEED}" for t in ALT_LEASES]
        keys += [f"window:{SEED_WINDOW}:2000:{ALT_SEED}",
                 f"lease:{N_LEASE}:31:{ALT_LEASE_N}"]
    return keys


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Observe a notebook's functions "
                                            "from outside its processes.")
    p.add_argument("cells")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    print(json.dumps(observe_remote(args.cells, args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
