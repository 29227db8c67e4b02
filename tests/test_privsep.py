"""Privilege separation: no judge shares a process with the learner's code.

The learner's module runs in a host process of its own (`handson.infra.learner_host`)
and the harness calls it over a pipe (`handson.infra.remote_module`). The attacks
here are the ones a hostile submission used when the judges imported its
module: patch the check table on import, print a forged chaos report and exit.
Run for real through `python -m autograder grade`, they must earn nothing.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder import notebook
from handson.infra import remote_module
from handson.infra.learner_module import ModuleProblem

ROOT = notebook.REPO
ENV = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep
           + os.environ.get("PATH", ""))
ENV.pop("REDIS_URL", None)
ENV.pop(remote_module.ENV, None)

# Stubs (as the exercise ships them) plus the forgery: on import, every check
# of the contract table passes; in the chaos run's process, a "valid" report.
FORGERY = '''
import json, os, sys

def enqueue(r, payload, job_id=None):
    raise NotImplementedError("enqueue")

def claim(r, lease_s):
    raise NotImplementedError("claim")

def ack(r, job_id, attempt):
    raise NotImplementedError("ack")

def extend(r, job_id, attempt, lease_s):
    raise NotImplementedError("extend")

def fail(r, job_id, attempt, error):
    raise NotImplementedError("fail")

def reap(r, max_attempts=3):
    raise NotImplementedError("reap")

def dead(r):
    raise NotImplementedError("dead")

def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    raise NotImplementedError("run_with_heartbeat")

try:
    import handson.queues.checks as _cc
    for _c in _cc.CHECKS.values():
        _c.fn = lambda q, r, url: "forged"
except Exception:
    pass
try:
    import autograder.heartbeat_trial as _ht
    _ht.trial = lambda module, url: {"forged": True}
except Exception:
    pass
if sys.argv[0].endswith("chaos.py"):
    _inv = {k: {"ok": True, "count": 0, "witnesses": []} for k in (
        "lost", "applied_twice", "unexpected", "dead_without_reason",
        "stale_ack_accepted", "stale_extend_accepted", "over_delivered")}
    print(json.dumps({"verdict": "valid", "seed": 1, "invariants": _inv,
                      "replay": "", "stats": {}}), flush=True)
    os._exit(0)
'''


def _forged_notebook(tmp_path: Path, assignment: str, module_file: str) -> Path:
    nb = nbformat.read(str(ROOT / "solutions" / assignment / f"{assignment}.ipynb"),
                       4)
    cell = next(c for c in nb.cells if c.cell_type == "code"
                and c.source.startswith(f"%%writefile {module_file}"))
    cell.source = f"%%writefile {module_file}\n" + FORGERY
    path = tmp_path / assignment / f"{assignment}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    return path


def _grade(path: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path),
                          "--json", "--quick"], cwd=ROOT, capture_output=True,
                         text=True, timeout=400, env=ENV)
    assert res.stdout, res.stderr[-2000:]
    return json.loads(res.stdout)


@pytest.mark.parametrize("assignment,module_file", [
    ("claim_ack_reap", "myqueue.py"), ("heartbeats", "heartbeat.py")])
def test_forged_verdicts_earn_nothing(tmp_path, assignment, module_file):
    data = _grade(_forged_notebook(tmp_path, assignment, module_file))
    passed = [c["name"] for c in data["checks"] if c["ok"]]
    assert data["score"] == 0, passed
    assert not [c for c in data["checks"] if c.get("got") == "forged"]
    # Refused by the static review of own work, or run and failed as stubs.
    text = json.dumps(data)
    assert "must be your own code" in text or "NotImplementedError" in text


def test_the_judges_alone_are_not_fooled_by_the_forgery(tmp_path):
    """Past the review of own work: the checks and chaos run the forged module
    behind the pipe, and nothing it does in its own process reaches a verdict."""
    from autograder import claim_ack_reap, queue_runs
    from handson.redis_server import EmbeddedRedis

    module = tmp_path / "myqueue.py"
    module.write_text(FORGERY)
    server = EmbeddedRedis().start()
    try:
        results, _ = queue_runs.contract(str(module), server.url,
                                         ["enqueue_idempotent", "attempt_grows"],
                                         timeout=120)
        report = queue_runs.chaos(str(module), server.url + "?db=1",
                                  claim_ack_reap.chaos_args(1, True), 120)
    finally:
        server.stop()
    assert set(results) == {"enqueue_idempotent", "attempt_grows"}
    for res in results.values():
        assert not res["ok"] and "NotImplementedError" in res["got"], res
    assert report["verdict"] != "valid", report


# The observation of assignment 1 used to run in the learner's kernel: a cell
# could replace it with one built from the grader's own reference numbers.
FORGED_OBSERVATION = '''
import json as _json
import autograder.delivery_semantics as _m
_ref = _m.reference()


def _forged(ns, quick=False, out_path=None):
    n, crashed = _ref["n"], _ref["crashed"]
    obs = {}
    for label in ("page", "alt"):
        bad = crashed[label]
        obs[f"ack_before_work:{label}"] = {"lost": bad, "once": n - len(bad),
                                           "dup": []}
        for d in ("ack_after_work", "dedup_outside_tx"):
            obs[f"{d}:{label}"] = {"lost": [], "once": n - len(bad), "dup": bad}
        obs[f"dedup_in_tx:{label}"] = {"lost": [], "once": n, "dup": []}
    obs["dedup_key"] = {"pairs": {str(j): {"same": True, "a1": str(j),
                                           "a2": str(j)} for j in (0, 7, 123)},
                        "distinct": True}
    for w, d in _ref["windows"].items():
        obs[f"window:{w}:2000"] = {"value": d}
    for (t, seed), v in _ref["leases"].items():
        obs[f"lease:{t}:{seed}"] = {"value": v}
    if out_path:
        with open(out_path, "w") as fh:
            _json.dump(obs, fh)
    return obs


_m.observe = _forged
_m.judge = lambda obs, quick=False: [_m.outcome(c, True) for c in _m.CHECKS]
'''


def test_forged_observation_earns_nothing(tmp_path):
    nb = nbformat.read(str(ROOT / "exercises" / "delivery_semantics"
                           / "delivery_semantics.ipynb"), 4)
    setup = next(c for c in nb.cells
                 if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    setup.source += "\n" + FORGED_OBSERVATION
    path = tmp_path / "delivery_semantics" / "delivery_semantics.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    data = _grade(path)
    assert data["score"] == 0, [c["name"] for c in data["checks"] if c["ok"]]
    assert "NotImplementedError" in json.dumps(data)   # the stubs really ran


# --- the proxy itself ------------------------------------------------------------

LEARNER = '''
import os, sys

print("hello from import")              # must not corrupt the pipe

class QueueFull(Exception):
    pass

def echo(r, *args, **kwargs):
    print("noise", args)
    return {"args": args, "kwargs": kwargs, "db": r.connection_pool
            .connection_kwargs.get("db"), "pid": os.getpid()}

def full(r):
    raise QueueFull("no room")

def bye(r):
    os._exit(7)

def now():
    import time
    return time.time()
'''


@pytest.fixture
def learner_file(tmp_path):
    path = tmp_path / "mod.py"
    path.write_text(textwrap.dedent(LEARNER))
    return str(path)


def test_calls_cross_the_pipe_with_types_and_errors(learner_file, redis_url):
    from handson.redis_server import connect

    mod = remote_module.load(learner_file, [])
    try:
        r = connect(redis_url, decode_responses=True)
        got = mod.echo(r, ("a", 1), b"\x00x", [1, None], k={"x": 1.5})
        assert got["args"] == (("a", 1), b"\x00x", [1, None])
        assert got["kwargs"] == {"k": {"x": 1.5}}
        assert got["pid"] != os.getpid()      # ran in the learner's process
        with pytest.raises(Exception) as err:
            mod.full(r)
        assert type(err.value).__name__ == "QueueFull"
        assert "no room" in str(err.value)
        with pytest.raises(remote_module.LearnerProcessDied,
                           match="exited with code 7 during bye"):
            mod.bye(r)
    finally:
        mod.close()


def test_import_problems_read_as_the_lab_says(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n")
    with pytest.raises(ModuleProblem, match="syntax error on line 1"):
        remote_module.load(str(bad), [])
    gone = tmp_path / "gone.py"
    gone.write_text("import os\nos._exit(3)\n")
    with pytest.raises(ModuleProblem, match="ended the process .exit code 3"):
        remote_module.load(str(gone), [])


def test_clock_skew_hook(learner_file, monkeypatch):
    import time

    monkeypatch.setenv("EO_CLOCK_SKEW_S", "3600")
    mod = remote_module.load(learner_file, [])
    try:
        assert mod.now() - time.time() > 3500
    finally:
        mod.close()
