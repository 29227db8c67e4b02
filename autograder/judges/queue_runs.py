"""Run the lab's judges on a learner's queue file, each in the sandbox.

Three steps, each a subprocess under `autograder.isolation.sandbox` with its own limit:

- `probe`: can the file be loaded as a queue at all (syntax, import, the
  seven functions)? Uses `handson.queues.contract.load_queue`, so the message is the
  one the lab gives.
- `contract`: `handson.queues.checks.run_checks` on the file, as JSON.
- `chaos`: `python -m handson.chaos ... --json` on the file: real workers,
  real SIGKILLs, a verdict per invariant.
- `contract_then_cost`: the same, then `handson.queues.cost.compare`: the
  file's round trips, commands and server CPU per job beside the reference
  queue's, from the server's counters.

Nothing here judges; the assignment modules turn the data into points.

None of these processes imports the learner's file: each is a trusted harness
that calls the module's functions in a host process of its own, started with
the sandbox's `learner_prefix` (EO_LEARNER_PREFIX, see `handson.infra.remote_module`).
What they print comes from code the learner cannot change, and the learner's
processes may write only in the module's directory, never in the harness's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from autograder.isolation import sandbox
from autograder.judges import live
from handson.infra import remote_module

PROBED = """
def probed(path):
    import json
    from handson.infra import remote_module
    from handson.queues.contract import ContractError, load_queue
    try:
        remote_module.stop(load_queue(path))    # its host goes before any check
        return json.dumps({"ok": True})
    except ContractError as err:
        return json.dumps({"ok": False, "error": str(err)})
    except BaseException as err:
        kind = "called sys.exit()" if isinstance(err, SystemExit) else \\
            f"raised {type(err).__name__}: {err}"
        return json.dumps({"ok": False, "error": f"importing {path} {kind}"})
"""
PROBE = "import sys\n" + PROBED + "print(probed(sys.argv[1]))\n"

CONTRACT = """
import gc, json, os, selectors, sys
""" + PROBED + """
from dataclasses import asdict
from handson.queues.checks import run_checks
gc.freeze()     # what is imported now, the forks below need not collect again
path, timeout = sys.argv[1], float(sys.argv[3]) if sys.argv[3] != "-" else None
lanes = json.loads(sys.argv[2])  # [[redis_url, [check, ...], {env}], ...]
gate = json.loads(sys.argv[6]) if sys.argv[6] != "-" else None   # one more, first
if sys.argv[5] != "-":          # the probe first, in this harness: one start less
    from handson.infra import remote_module
    os.environ.update((gate or lanes[0])[2])
    usual, remote_module.START_TIMEOUT_S = remote_module.START_TIMEOUT_S, \\
        float(sys.argv[5])
    probe = json.loads(probed(path))
    remote_module.START_TIMEOUT_S = usual
    print(json.dumps({"probe": probe}), flush=True)
    if not probe["ok"]:
        sys.exit(0)
def lane(url, names, env, out):
    os.environ.update(env)      # the lane's database, in its hosts' REDIS_URL too
    passed = True
    for name in names:
        res = run_checks(path, url, only=[name], timeout=timeout)[0]
        passed = passed and res.ok
        out.write(json.dumps(asdict(res)) + "\\n")
        out.flush()
    return passed
def cost(url):
    import signal
    from handson.queues.cost import compare, LIMIT_S
    def late(*_):
        raise TimeoutError(f"not done in {LIMIT_S} s")
    signal.signal(signal.SIGALRM, late)
    signal.alarm(LIMIT_S)
    try:
        print(json.dumps({"cost": compare(path, url)}), flush=True)
    except Exception as err:
        print(json.dumps({"cost": {"error": f"{type(err).__name__}: {err}"}}),
              flush=True)
    signal.alarm(0)
if gate:        # the gate's checks, then its cost, said before any lane starts
    if lane(*gate, sys.stdout) and sys.argv[4] != "-":
        cost(sys.argv[4])
    print(json.dumps({"gate_done": True}), flush=True)
if not lanes:
    passed = False
elif len(lanes) == 1:
    passed = lane(*lanes[0], sys.stdout)
else:       # one process a lane, forked once this one has imported everything
    from handson.infra import remote_module
    remote_module.share_hosts()
    sel, pids = selectors.DefaultSelector(), []
    for url, names, env in lanes:
        r, w = os.pipe()
        pids.append(os.fork())
        if pids[-1] == 0:
            code = 1
            try:
                os.close(r)
                with os.fdopen(w, "w") as out:
                    lane(url, names, env, out)
                code = 0
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                os._exit(code)
        os.close(w)
        sel.register(r, selectors.EVENT_READ, [b""])
    while sel.get_map():
        for key, _ in sel.select():
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
                chunk = b"\\n"
            *lines, key.data[0] = (key.data[0] + chunk).split(b"\\n")
            for line in lines:
                if line:
                    sys.stdout.buffer.write(line + b"\\n")
            sys.stdout.buffer.flush()
    for pid in pids:
        os.waitpid(pid, 0)
    passed = False
if sys.argv[4] != "-" and passed and not gate:     # then the cost, on that database
    cost(sys.argv[4])
"""

def learner_env(path: str, redis_url: str | None,
                imports: tuple[str, ...] = (), pg_url: str | None = None) -> dict:
    """The harness's environment: learner code only behind the sandbox prefix.

    `imports`: course files (repo-relative) the assignment lets the module use;
    `pg_url`: the learner's role on the run's PostgreSQL
    (`autograder.isolation.pg_run`).
    """
    root = Path(remote_module.ROOT)
    reads = (str(Path(path).resolve()), *remote_module.HOST_FILES,
             *(str(root / f) for f in imports))
    # The work dir from the path as given: a link never moves it elsewhere.
    prefix = sandbox.learner_prefix(os.path.dirname(os.path.abspath(path)),
                                    redis_url, reads, pg_url)
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    env[remote_module.ENV] = json.dumps(prefix)
    return env


def kernel_imports(reads: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`imports` for a host: the course files the learner's kernel may read
    (`sandbox.kernel_read_paths()`, or `reads` if already computed)."""
    root = Path(remote_module.ROOT)
    return tuple(str(Path(f).relative_to(root))
                 for f in reads or sandbox.kernel_read_paths())


def probe(path: str, timeout: float = 30, imports: tuple[str, ...] = ()) -> dict:
    """{"ok": True} or {"ok": False, "error": why} for loading the file."""
    fin = sandbox.run([sys.executable, "-c", PROBE, path], timeout=timeout,
                      env=learner_env(path, None, imports))
    for line in reversed(fin.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return _unprobed(path, fin, timeout)


def _unprobed(path: str, fin: sandbox.Finished, timeout: float) -> dict:
    """The probe's verdict when its harness said none."""
    if fin.timed_out:
        return {"ok": False, "error": f"importing {path} did not finish in "
                                      f"{timeout:g} s (an endless loop at import?)"}
    return {"ok": False, "error": f"importing {path} ended the process (exit code "
                                  f"{fin.returncode}): {fin.tail(300)}"}


def contract(path: str, redis_url: str, names: list[str], timeout: float,
             per_check_s: float | None = None, imports: tuple[str, ...] = (),
             on_result: Callable[[dict], None] | None = None
             ) -> tuple[dict, list[str]]:
    """name -> CheckResult dict for each check that reported; plus leftovers.
    `on_result` hears each as it reports."""
    results, leftovers, _ = contract_then_cost(path, redis_url, names, timeout,
                                               per_check_s, imports,
                                               on_result=on_result)
    return results, leftovers


def contract_lanes(path: str, lanes: list[tuple[str, list[str]]], timeout: float,
                   on_result: Callable[[dict], None] | None = None,
                   stop: threading.Event | None = None) -> tuple[dict, list[str]]:
    """`contract` for lanes side by side, each (redis_url, its checks in order)
    on a database of its own: one harness whose forks run the lanes, so the
    imports and the server of hosts are paid for once, not once a lane.
    `stop`, once set, ends them all."""
    results, leftovers, _ = contract_then_cost(path, lanes[0][0], [], timeout,
                                               on_result=on_result, lanes=lanes,
                                               stop=stop)
    return results, leftovers


class NotLoadable(Exception):
    """The file cannot be loaded as a queue; the message says why, as `probe`'s."""


def contract_then_cost(path: str, redis_url: str, names: list[str],
                       timeout: float, per_check_s: float | None = None,
                       imports: tuple[str, ...] = (), cost_url: str | None = None,
                       on_result: Callable[[dict], None] | None = None,
                       lanes: list[tuple[str, list[str]]] | None = None,
                       stop: threading.Event | None = None,
                       probe_s: float | None = None,
                       gate: list[str] | None = None,
                       on_gate: Callable[[], None] | None = None
                       ) -> tuple[dict, list[str], dict]:
    """`contract`, then, if every check passed, in the same harness (one sandbox
    start less) the file's cost beside the reference's on `cost_url`
    (`handson.queues.cost.compare`), or {"error": why}. The server's counters
    are server-wide: nothing else may use the server meanwhile.
    `probe_s`: first `probe` the file in that harness, its import given that
    long; NotLoadable if it fails, and nothing else runs.
    `gate`: checks run first on `redis_url`, alone, then the cost (if they
    passed), then `lanes`; `on_gate` is called once those are said, so the
    caller may start what needs the server to itself no more (or `stop` us)."""
    lanes = lanes or ([] if gate else [(redis_url, names)])
    heads = [(redis_url, gate)] if gate else []
    names = [n for _, lane in heads + lanes for n in lane]
    # Each lane's hosts are told its own database, as a harness of its own
    # would tell them: nothing a learner's code reads says which lane it is in.
    envs = [learner_env(path, url, imports) for url, _ in heads + lanes]
    spec = [[url, list(lane), {k: env[k] for k in ("REDIS_URL", remote_module.ENV)}]
            for (url, lane), env in zip(heads + lanes, envs, strict=True)]
    first = spec.pop(0) if gate else None
    fin = sandbox.run([sys.executable, "-c", CONTRACT, path, json.dumps(spec),
                       str(per_check_s) if per_check_s else "-", cost_url or "-",
                       f"{probe_s:g}" if probe_s else "-",
                       json.dumps(first) if first else "-"],
                      timeout=timeout, env=envs[0],
                      on_line=_hearing(on_result, on_gate), stop=stop)
    results, cost, probed = {}, {}, None
    for line in fin.stdout.splitlines():
        try:
            res = json.loads(line)
        except ValueError:
            continue
        if isinstance(res, dict) and "name" in res:
            results[res["name"]] = res
        elif isinstance(res, dict) and "cost" in res:
            cost = res["cost"]
        elif isinstance(res, dict) and "probe" in res:
            probed = res["probe"]
    if probe_s and not (probed or {}).get("ok"):
        raise NotLoadable((probed or _unprobed(path, fin, timeout))["error"])
    if cost_url and not cost:
        before = gate or names          # the checks the cost waits for
        why = ("not tried: a check failed" if not all(
                   results.get(n, {}).get("ok") for n in before)
               else f"the harness did not finish within {timeout:g} s"
               if fin.timed_out else f"the harness ended with exit code "
               f"{fin.returncode}: {fin.tail(300)}")
        cost = {"error": why}
    if "error" in cost:
        cost = {"error": f"the queue's cost was not measured ({cost['error']})"}
    return results, fin.leftovers, cost


def _hearing(on_result: Callable[[dict], None] | None,
             on_gate: Callable[[], None] | None = None) -> Callable[[str], None]:
    """A harness's stdout line: each check's result, said (`live`) and handed
    on; the end of its gate, told."""
    def hear(line: str) -> None:
        try:
            res = json.loads(line)
        except ValueError:
            return
        if isinstance(res, dict) and "name" in res and "ok" in res:
            live.say(res["name"], bool(res["ok"]), res.get("got", ""))
            if on_result is not None:
                on_result(res)
        elif isinstance(res, dict) and res.get("gate_done") and on_gate is not None:
            on_gate()
    return hear


def stopped() -> dict:
    """The report of a chaos run a quick check stopped (or would have)."""
    return {"verdict": "unknown", "invariants": {}, "replay": "", "stats": {},
            "reason": "the quick check stopped the chaos run once a contract check "
                      "failed (fix that first; `grade` runs it to the end)"}


def chaos(path: str, redis_url: str, args: list[str], timeout: float,
          imports: tuple[str, ...] = (), env: dict | None = None,
          stop: threading.Event | None = None) -> dict:
    """The chaos report as a dict; verdict "unknown" with a reason if none came.

    `env`: the harness's, if not `learner_env(path, redis_url, imports)`;
    `stop`, once set, ends the run (its reason says so)."""
    # The engine's scratch folder goes in one of ours: a run killed at its
    # limit, or stopped, cannot remove its own.
    with tempfile.TemporaryDirectory(prefix="eo-chaos-run-") as scratch:
        fin = sandbox.run([sys.executable, "-m", "handson.chaos", *args, "--queue",
                           path, "--json"], timeout=timeout,
                          env={**(env or learner_env(path, redis_url, imports)),
                               "TMPDIR": scratch}, stop=stop)
    if stop is not None and stop.is_set() and fin.supervisor_killed:
        return stopped()
    try:
        start = fin.stdout.index("{")
        report = json.loads(fin.stdout[start:])
    except ValueError:
        why = (f"did not finish within {timeout:g} s" if fin.timed_out else
               f"ended with exit code {fin.returncode} and no report: "
               f"{fin.tail(300)}")
        return {"verdict": "unknown", "reason": f"the chaos run {why}",
                "invariants": {}, "replay": "", "stats": {}}
    report.setdefault("replay", "")
    if fin.leftovers:
        report["leftovers"] = fin.leftovers
    return report

