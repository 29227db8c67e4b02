"""Assignment outbox_relay: the learner's outbox save, relay and consumer, killed.

The notebook's `%%writefile myoutbox.py` cell writes a module with

    save_document(db, doc_id, body, pause)   # document + outbox row, one transaction
    relay_once(db, r, queue, pause) -> int   # publish unsent rows, then mark them
    summarize(db, doc_id) -> bool            # the consumer's effect, once per doc

on the tables `handson.outbox.setup` makes. It is graded by behaviour:
`python -m handson.outbox_runs --module myoutbox.py --json` (in the sandbox,
on the grader's own Redis) kills the save handler between its two inserts and
the relay between publishing a row and recording it, each with SIGKILL at the
named point `pause("between", n)`, delivers every job twice to the consumer,
and commits outbox rows out of id order while the relay polls. Then, where the
learner named no point, each of the three functions is killed after each of
its round trips, every SQL statement and Redis reply (`handson.outbox_trips`):
a gap the pause does not mark is found all the same. And the consumer is
stopped after each of its round trips while another consumer, in a process of
its own, summarizes the same document (`outbox_trips.interleaved_consumers`).
The relay is stopped after each of its round trips while writers commit rows
with lower ids than ones it read, out of id order
(`outbox_trips.writers_race_relay`), and two consumers that keep one
connection each across deliveries, as long-running workers do, take the same
document in turn (`outbox_trips.reused_consumers`).

The experiments and their workers are a trusted harness
(`queue_runs.learner_env`): the grader imports none of the learner's code, and
neither do they. Each worker calls the module in a host process of its own,
confined to the run's work dir (`handson.infra.remote_module`): the host opens
the database (in the work dir) and the run's Redis itself and imports the
course's queue by name; `pause` is called back, so the announcement a worker
is killed on comes from the worker. The judge reads the database and Redis,
as the issue accepts. The host may read what the learner's kernel may read.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from autograder.isolation import sandbox
from autograder.judges import queue_runs
from autograder.judges.checks import (
    Check,
    Evaluation,
    ModuleFile,
    Outcome,
    missed_pause,
    not_run,
    outcome,
    round_trips,
)

NAME = "outbox_relay"
MODULE_FILE = "myoutbox.py"
CHECKS = [
    Check("save_atomic", 2,
          "handler killed between its inserts: no document without its job"),
    Check("relay_nothing_lost", 3,
          "relay killed between publish and mark: every document still delivered"),
    Check("relay_kills_effects_once", 1,
          "relay killed, end to end: duplicates delivered, none applied twice"),
    Check("effects_once", 2,
          "every job delivered twice: each document summarized once"),
    Check("no_skip_out_of_order", 3,
          "rows committed out of id order: the relay publishes every one"),
    Check("killed_between_round_trips", 2,
          "save, relay and consumer each killed after every SQL statement and "
          "Redis reply: nothing lost, each effect once"),
    Check("consumers_interleaved", 1,
          "a consumer stopped after each round trip while another consumes "
          "the same job: the effect once"),
    Check("writers_race_relay", 2,
          "relay stopped after each round trip while writers commit rows, "
          "lower ids and out of order: every row published"),
    Check("consumers_reused", 1,
          "two long-running consumers, one connection each kept across "
          "deliveries, the same job to both: the effect once"),
]
NOTEBOOK_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180
PAUSE_HINT = ("call pause('between', n) at the named point (save_document: after "
              "the document insert, n = doc_id; relay_once: after publishing a "
              "row, n = its outbox id)")


# --- observing (in the sandbox) -------------------------------------------------

def observe(path: str, redis_url: str, timeout: float = RUN_TIMEOUT_S) -> dict:
    """The lab's outbox experiments on the learner's module, as plain data."""
    workdir = Path(path).parent
    env = queue_runs.learner_env(path, redis_url, queue_runs.kernel_imports())
    env.pop("DATABASE_URL", None)
    with tempfile.TemporaryDirectory(prefix="eo-outbox-db-", dir=workdir) as db:
        try:
            fin = sandbox.run([sys.executable, "-m", "handson.outbox_runs",
                               "--module", path, "--json",
                               "--db", str(Path(db) / "app.sqlite")],
                              timeout=timeout, env=env)
        finally:
            sandbox.cleanup(workdir)
    for line in reversed(fin.stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    why = (f"did not finish within {timeout:g} s" if fin.timed_out else
           f"ended with exit code {fin.returncode}: {fin.tail(400)}")
    return {"error": f"the outbox run {why}"}


# --- judging (pure) -------------------------------------------------------------

def _run(obs: dict, name: str) -> tuple[dict | None, str]:
    data = obs.get(name)
    if data is None:
        return None, obs.get("error", f"{name} did not report")
    if "error" in data:
        err = missed_pause(data["error"])
        if err != data["error"]:
            err += f"; {PAUSE_HINT}"
        else:
            err = err[-600:]
        return None, f"{name}: {err}"
    return data, ""


def judge(obs: dict) -> list[Outcome]:
    by = {c.name: c for c in CHECKS}
    out = []
    d, err = _run(obs, "save_killed")
    if d is None:
        out.append(outcome(by["save_atomic"], False, err))
    else:
        out.append(outcome(
            by["save_atomic"],
            d["documents_without_job"] == 0 and d["jobs_without_document"] == 0
            and d["documents"] == d["jobs"],
            "write the document and its outbox row in ONE transaction "
            "(`with db.transaction():`), so a kill between them leaves neither",
            "0 documents without a job, 0 jobs without a document",
            f"{d['documents_without_job']} documents without a job, "
            f"{d['jobs_without_document']} jobs without a document "
            f"({d['kills']} kills)"))
    d, err = _run(obs, "relay_killed")
    if d is None:
        out.append(outcome(by["relay_nothing_lost"], False, err))
        out.append(outcome(by["relay_kills_effects_once"], False, err))
    else:
        out.append(outcome(
            by["relay_nothing_lost"], d["lost"] == 0,
            "publish first, then record the row as sent (or delete it): a relay "
            "killed between the two must publish the row again, never forget it",
            "0 documents never delivered",
            f"{d['lost']} of {d['documents']} never delivered "
            f"({d['relay_kills']} relay kills)"))
        out.append(outcome(
            by["relay_kills_effects_once"], d["duplicate_effects"] == 0,
            "the relay's duplicates must be absorbed by the consumer's key",
            "0 documents summarized twice",
            f"{d['duplicate_effects']} summarized twice "
            f"({d['duplicate_deliveries']} duplicate deliveries)"))
    d, err = _run(obs, "doubled_deliveries")
    if d is None:
        out.append(outcome(by["effects_once"], False, err))
    else:
        out.append(outcome(
            by["effects_once"],
            d["duplicate_effects"] == 0 and d["effects"] == d["documents"],
            "write the consumer's key (summarized) and the effect (summaries) in "
            "one transaction, and apply the effect only when the key is new",
            f"{d['documents']} summaries for {d['documents']} documents",
            f"{d['effects']} summaries, {d['duplicate_effects']} duplicated"))
    d, err = _run(obs, "out_of_order")
    if d is None:
        out.append(outcome(by["no_skip_out_of_order"], False, err))
    else:
        out.append(outcome(
            by["no_skip_out_of_order"], d["skipped"] == 0,
            "ids are taken before commit, so a smaller id can commit after a "
            "larger one was published: select the rows not yet sent, not "
            "`id > last published id`",
            f"all {d['writers']} rows published",
            f"{d['skipped']} of {d['writers']} never published by one relay "
            f"kept running, polling after each commit (commit order "
            f"{d['commit_order']})"))
    out.append(_round_trips(obs, by["killed_between_round_trips"]))
    d, err = _run(obs, "interleaved")
    out.append(round_trips(by["consumers_interleaved"], d, err,
                           "document 0 summarized once, whatever ran between "
                           "two round trips of its consumer",
                           "stops while another consumer ran"))
    d, err = _run(obs, "writers_race")
    out.append(round_trips(by["writers_race_relay"], d, err,
                           "every document delivered, whatever writers "
                           "committed while the relay was stopped",
                           "stops while writers committed"))
    d, err = _run(obs, "reused")
    out.append(round_trips(by["consumers_reused"], d, err,
                           "each document summarized once, whichever "
                           "long-running worker took it",
                           "deliveries on two long-lived connections"))
    return out


def _round_trips(obs: dict, check: Check) -> Outcome:
    """Kills the learner did not name: after each round trip of each function
    (`handson.outbox_trips`)."""
    d, err = _run(obs, "round_trips")
    return round_trips(check, d, err, "after any kill: every document has its "
                       "job, every job is delivered, each document summarized "
                       "once")


def evaluate_file(path: str, redis_url: str, quick: bool = False,
                  shown_path: str = MODULE_FILE) -> Evaluation:
    if not Path(path).exists():
        return Evaluation(not_run(CHECKS, f"no {shown_path} was written: run the "
                                          f"`%%writefile {shown_path}` cell"))
    obs = observe(os.path.abspath(path), redis_url)
    problems = [obs["error"]] if "error" in obs else []
    return Evaluation(judge(obs), problems)


# --- the grader side and the notebook side --------------------------------

CELLS = ModuleFile(NAME, MODULE_FILE, evaluate_file)
evaluate, check, check_all = CELLS.evaluate, CELLS.check, CELLS.check_all
