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

from autograder.notebooks import notebook
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
    import autograder.judges.heartbeat_trial as _ht
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


def _forged_notebook(tmp_path: Path, assignment: str, module_file: str,
                     module: str = FORGERY, source: str = "solutions") -> Path:
    nb = nbformat.read(str(ROOT / source / assignment / f"{assignment}.ipynb"), 4)
    cell = next(c for c in nb.cells if c.cell_type == "code"
                and c.source.startswith(f"%%writefile {module_file}"))
    cell.source = f"%%writefile {module_file}\n" + module
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
    from autograder.judges import claim_ack_reap, queue_runs
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
import autograder.judges.delivery_semantics as _m
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

def ping(r):
    return r.ping()

def bye(r):
    os._exit(7)

def three(r):
    for key in ("a", "b", "c"):
        r.set(key, 1)

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


CALLING_BACK = '''
import os

for fd in range(3, 10):                 # junk in the pipe before the hello
    try:
        os.write(fd, b"paused after-claim\\n")
    except OSError:
        pass


def job(db, mailer, pause):
    pause("after-claim")
    mailer.send("a@b", "hi", "there", reference="k")
    found = mailer.lookup("k")
    try:
        mailer.count()
        reached = "count"
    except AttributeError:
        reached = "no count"
    try:
        mailer.__class__.serve
        reached += ", serve"
    except AttributeError:
        pass
    return [found, mailer.takes_reference, reached, os.getpid(), db.dialect,
            db.query("SELECT 41 + 1")[0][0]]
'''


class _Mailbox:
    takes_reference = True

    def __init__(self):
        self.sent, self.secret = [], "the grader's"

    def send(self, to, subject, body, reference=None):
        self.sent.append((to, subject, body, reference))

    def lookup(self, reference):
        return any(m[3] == reference for m in self.sent)

    def count(self):
        return len(self.sent)


def test_callbacks_reach_only_what_the_caller_offers(tmp_path):
    """The host calls back the caller's mailer and pause in the middle of a
    call; nothing of the caller's but the listed methods is reachable."""
    path = tmp_path / "job.py"
    path.write_text(CALLING_BACK)
    mailbox, points = _Mailbox(), []
    mod = remote_module.load(str(path), [])
    try:
        db = remote_module.Local("course_object", module="handson.effects.sqldb",
                                 name="Database", args=[str(tmp_path / "x.db")])
        got = mod.job(db, remote_module.Caller(mailbox, ("send", "lookup"),
                                               ("takes_reference",)),
                      remote_module.Caller(points.append, name="pause"))
    finally:
        mod.close()
    assert got[:3] == [True, True, "no count"]
    assert got[3] != os.getpid() and got[4:] == ["sqlite", 42]
    assert points == ["after-claim"]
    assert mailbox.sent == [("a@b", "hi", "there", "k")]


def test_armed_call_dies_after_a_redis_reply(learner_file, redis_url):
    """The mid-call crash point, installed on the first call that asks for it."""
    from handson.redis_server import connect

    mod = remote_module.load(learner_file, [])
    try:
        r = connect(redis_url)
        assert mod.ping(r) is True
        mod.arm_crash(1)
        with pytest.raises(remote_module.LearnerProcessDied):
            mod.ping(r)
    finally:
        mod.close()


def test_an_armed_call_can_die_after_any_of_its_round_trips(learner_file,
                                                            redis_url):
    """The host counts a call's replies, so a crash can land between any two."""
    from handson.redis_server import connect

    mod = remote_module.load(learner_file, [])
    try:
        r = connect(redis_url, decode_responses=True)
        r.delete("a", "b", "c")
        assert mod.replies("three") == 1              # nothing known yet
        mod.three(r)                  # the first also reads the connection's hello
        mod.three(r)
        assert mod.replies("three") == 3
        r.delete("a", "b", "c")
        mod.arm_crash(2)
        with pytest.raises(remote_module.LearnerProcessDied):
            mod.three(r)
        assert [r.exists(k) for k in "abc"] == [1, 1, 0]
    finally:
        mod.close()


def test_a_call_armed_between_round_trips_dies_only_if_it_makes_another(
        learner_file, redis_url):
    """The chaos run's mid-reap point: the host dies as the call sends a request
    after reply k; a new connection's handshake is none of the call's, and a
    call with no request after reply k goes on."""
    from handson.redis_server import connect

    mod = remote_module.load(learner_file, [])
    try:
        r = connect(redis_url, decode_responses=True)
        r.delete("a", "b", "c")
        mod.arm_crash_between(1)      # the first call also makes the connection
        with pytest.raises(remote_module.LearnerProcessDied):
            mod.three(r)
        assert [r.exists(k) for k in "abc"] == [1, 0, 0]
        r.delete("a", "b", "c")
        mod.arm_crash_between(3)
        mod.three(r)                  # three replies, no fourth request: lives
        assert [r.exists(k) for k in "abc"] == [1, 1, 1]
        mod.arm_crash_between(1)
        assert mod.ping(r) is True    # one round trip: no gap to die in
    finally:
        mod.close()


def test_an_armed_pause_runs_a_rival_between_two_round_trips(learner_file,
                                                              redis_url):
    """The interleaving checks' stop: after reply k the caller's code runs, on
    the caller's side, and the call then goes on; "every" stops at each reply."""
    from handson.redis_server import connect

    mod = remote_module.load(learner_file, [])
    try:
        r = connect(redis_url, decode_responses=True)
        mod.three(r)                  # the connection's hello is read here
        seen: list = []
        r.delete("a", "b", "c")
        mod.arm_pause(2, lambda k: seen.append((k, [r.exists(x) for x in "abc"])))
        mod.three(r)
        assert seen == [(2, [1, 1, 0])]
        assert [r.exists(x) for x in "abc"] == [1, 1, 1]
        seen.clear()
        r.delete("a", "b", "c")
        mod.arm_pause("every", lambda k: seen.append((k, r.exists("a", "b", "c"))))
        mod.three(r)
        assert seen == [(1, 1), (2, 2), (3, 3)]
        mod.ping(r)                   # unarmed again: no pause
        assert len(seen) == 3
    finally:
        mod.close()


LIAR = '''
import sys

HOST = sys.modules["__main__"]          # the learner host runs as a script


def three(r):                           # reads three replies, says a thousand
    for key in ("a", "b", "c"):
        r.set(key, 1)
    HOST._ARMED.replies = 1000


def deaf(r):                            # forgets the reply it should die after
    HOST._ARMED.after = None
    for key in ("a", "b", "c"):
        r.set(key, 1)
'''


def test_a_host_that_lies_about_its_replies_only_makes_the_kill_miss(tmp_path,
                                                                      redis_url):
    """The count and the arming live in the learner's process, so it can lie
    about both; all a lie buys is a crash that does not happen, which leaves the
    chaos run short of its kill quota (unknown, see test_chaos), never a pass."""
    from handson.redis_server import connect

    path = tmp_path / "liar.py"
    path.write_text(textwrap.dedent(LIAR))
    mod = remote_module.load(str(path), [])
    try:
        r = connect(redis_url, decode_responses=True)
        mod.three(r)
        assert mod.replies("three") == 1000
        # The harness draws the reply to die after from the count: from a lie,
        # mostly past the three real ones. The deaf one unarms any draw.
        for fn, k in ((mod.three, 500), (mod.deaf, 2)):
            r.delete("a", "b", "c")
            mod.arm_crash(k)
            fn(r)                              # armed, yet it lives
            assert [r.exists(k) for k in "abc"] == [1, 1, 1]
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


# --- idempotent_claims: the mailbox and the pause points are the harness's -------

# What a forger uses to learn its case and to speak for the worker: its own
# command line, its parent's, its environment; every pipe it can reach.
SPY = '''
import os, stat, sys, time
def _argv():
    words = list(sys.argv) + [f"{k}={v}" for k, v in os.environ.items()]
    for pid in ("self", str(os.getppid())):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                words += fh.read().decode(errors="replace").split("\\0")
        except OSError:
            pass
    return words


def _say(text):
    print(text, flush=True)
    for fd in [*range(1, 40), f"/proc/{os.getppid()}/fd/1"]:   # every pipe
        try:
            if stat.S_ISFIFO(os.stat(fd).st_mode):
                if isinstance(fd, int):
                    os.write(fd, (text + "\\n").encode())
                else:
                    with open(fd, "a") as fh:
                        fh.write(text + "\\n")
        except OSError:
            pass
'''

# A job that does the database part honestly (policy "hold"); what it does with
# the mail provider and the pause points is each attack's own (`_email`, `_pause`).
CLAIMS_JOB = SPY + '''
import glob, sqlite3, tempfile

POLICY = "hold"
JOB, POINTS = "send_confirmation", "award_points"


def _claim(db, job, key, now):
    rows = db.query("INSERT INTO handled_operations (job_type, operation_key, "
                    "status, claimed_at) VALUES (?, ?, 'claimed', ?) ON CONFLICT "
                    "(job_type, operation_key) DO NOTHING RETURNING id",
                    (job, key, now))
    return rows[0][0] if rows else None


def _done(db, op_id, now):
    db.run("UPDATE handled_operations SET status = 'completed', completed_at = ?"
           " WHERE id = ?", (now, op_id))


def send_confirmation(db, mailer, key, now, lease_s, pause):
    op_id = _claim(db, JOB, key, now)
    if op_id is None:
        status, at = db.query("SELECT status, claimed_at FROM handled_operations "
                              "WHERE job_type = ? AND operation_key = ?",
                              (JOB, key))[0]
        if status == "completed" or now - at < lease_s:
            return "skip"
        db.run("INSERT INTO held_operations (job_type, operation_key, held_at) "
               "VALUES (?, ?, ?) ON CONFLICT DO NOTHING", (JOB, key, now))
        return "held"
    _pause(pause, "after-claim")
    _email(mailer, key)
    _pause(pause, "after-email")
    _done(db, op_id, now)
    return "sent"


def award_points(db, key, now, lease_s, pause):
    with db.transaction():
        op_id = _claim(db, POINTS, key, now)
        if op_id is not None:
            _pause(pause, "after-claim")
            db.run("INSERT INTO points_ledger (order_key, points) VALUES (?, 10)",
                   (key,))
            _pause(pause, "after-effect")
            _done(db, op_id, now)
    return "applied" if op_id is not None else "skip"


def _mailboxes():
    """Every provider store this process can find (the lab's naming)."""
    roots = {tempfile.gettempdir(), "/tmp", "/var/tmp", os.getcwd(),
             os.path.dirname(os.getcwd()), os.path.expanduser("~")}
    found = set()
    for root in roots:
        for pattern in ("mailbox-*.sqlite", "*/mailbox-*.sqlite",
                        "eo-*/*/mailbox-*.sqlite"):
            found |= set(glob.glob(os.path.join(root, pattern)))
    return sorted(found)


def _write(path, sql, params=()):
    try:
        conn = sqlite3.connect(path, timeout=2)
        conn.execute("CREATE TABLE IF NOT EXISTS sent (n INTEGER PRIMARY KEY, "
                     "recipient TEXT, subject TEXT, body TEXT, reference TEXT)")
        conn.execute(sql, params)
        conn.commit()
        conn.close()
    except Exception as err:
        print("forgery failed:", path, err, file=sys.stderr)


def _forge_email(path, key):
    _write(path, "INSERT INTO sent (recipient, subject, body, reference) "
           "VALUES (?, ?, ?, ?)", ("customer@example.com",
                                  f"Your order {key} is confirmed", "x", key))
'''

# (a) never calls mailer.send: writes the row into the provider's store itself.
MAILBOX_FORGERY = CLAIMS_JOB + '''

def _pause(pause, point):
    pause(point)


def _email(mailer, key):
    for path in _mailboxes():
        _forge_email(path, key)
'''

# (b) learns where the provider's store is (and which case runs) from its
# command line, its parent's and its environment, and writes the row there.
ARGV_FORGERY = CLAIMS_JOB + '''

def _pause(pause, point):
    pause(point)



def _email(mailer, key):
    words = _argv()
    paths = {w.split("=", 1)[-1] for w in words
             if "mailbox-" in w and w.endswith(".sqlite")}
    for path in sorted(paths):
        _forge_email(path, key)
'''

# (a') sends every email twice (a bug), then deletes the extra rows in every
# provider store it can find.
DELETING_FORGERY = CLAIMS_JOB + '''

def _pause(pause, point):
    pause(point)


def _email(mailer, key):
    mailer.send("customer@example.com", f"Your order {key} is confirmed", "x")
    mailer.send("customer@example.com", f"Your order {key} is confirmed", "x")
    for path in _mailboxes():
        _write(path, "DELETE FROM sent WHERE n NOT IN "
               "(SELECT min(n) FROM sent GROUP BY subject)")
'''

# (c) sends honestly, but speaks for the worker: says "paused <point>" itself
# (on stdout, on every descriptor it has, on its parent's stdout) where the
# command line asks for a kill, instead of calling pause.
PROTOCOL_FORGERY = ARGV_FORGERY + '''


def _pause(pause, point):
    words = _argv()
    if "--pause-at" in words and words[words.index("--pause-at") + 1] == point:
        _say(f"paused {point}")
        time.sleep(40)


def _email(mailer, key):
    mailer.send("customer@example.com", f"Your order {key} is confirmed", "x")
'''

EMAIL_CHECKS = ("first_delivery", "repeat_after_success", "two_workers_at_once",
                "different_order", "dies_after_email")
PAUSE_CHECKS = ("dies_before_email", "dies_after_email", "young_claim_skipped",
                "same_transaction_effect")


@pytest.mark.parametrize("forgery,forged,honest", [
    (MAILBOX_FORGERY, EMAIL_CHECKS,
     ("dies_before_email", "young_claim_skipped", "same_transaction_effect")),
    (ARGV_FORGERY, EMAIL_CHECKS,
     ("dies_before_email", "young_claim_skipped", "same_transaction_effect")),
    (DELETING_FORGERY, EMAIL_CHECKS,
     ("dies_before_email", "young_claim_skipped", "same_transaction_effect")),
    (PROTOCOL_FORGERY, PAUSE_CHECKS,
     ("first_delivery", "repeat_after_success", "two_workers_at_once",
      "different_order"))], ids=["mailbox", "argv", "delete", "protocol"])
def test_claims_forgeries_earn_nothing(tmp_path, forgery, forged, honest):
    """The provider's counts and the pause announcements come from the worker,
    never from the learner's process: what it forges earns nothing, what it
    does honestly (the database part) still earns its points."""
    nb_path = _forged_notebook(tmp_path, "idempotent_claims", "myclaims.py",
                               forgery, source="exercises")
    data = _grade(nb_path)
    by = {c["name"]: c for c in data["checks"]}
    assert not [n for n in forged if by[n]["ok"]], data
    assert all(by[n]["ok"] for n in honest), data


# --- outbox_relay: the kill points are announced by the worker ------------------

# A save in two transactions and a relay that marks before it publishes, both
# wrong; where the command line says the kill comes, it first says "paused
# between n" itself and waits to be killed before doing anything, so a harness
# that believed it would see nothing half done.
OUTBOX_FORGERY = SPY + '''

def _forge(n):
    words = _argv()
    if "--pause-n" in words and words[words.index("--pause-n") + 1] == str(n):
        _say(f"paused between {n}")
        time.sleep(40)


def save_document(db, doc_id, body, pause):
    _forge(doc_id)
    db.run("INSERT INTO documents (id, body) VALUES (?, ?)", (doc_id, body))
    pause("between", doc_id)
    db.run("INSERT INTO outbox (doc_id) VALUES (?)", (doc_id,))


def relay_once(db, r, queue, pause, batch=100):
    rows = db.query("SELECT id, doc_id FROM outbox WHERE sent = 0 ORDER BY id"
                    " LIMIT ?", (batch,))
    for outbox_id, doc_id in rows:
        _forge(outbox_id)
        db.run("UPDATE outbox SET sent = 1 WHERE id = ?", (outbox_id,))
        pause("between", outbox_id)
        queue.enqueue(r, {"doc_id": doc_id, "outbox_id": outbox_id})
    return len(rows)


def summarize(db, doc_id):
    with db.transaction():
        if not db.query("INSERT INTO summarized (doc_id) VALUES (?)"
                        " ON CONFLICT (doc_id) DO NOTHING RETURNING doc_id",
                        (doc_id,)):
            return False
        db.run("INSERT INTO summaries (doc_id) VALUES (?)", (doc_id,))
    return True
'''


def test_outbox_forged_kill_points_earn_nothing(tmp_path):
    """Its wrong save and relay lose their checks; its honest consumer and
    flag-based relay keep theirs."""
    data = _grade(_forged_notebook(tmp_path, "outbox_relay", "myoutbox.py",
                                   OUTBOX_FORGERY, source="exercises"))
    by = {c["name"]: c for c in data["checks"]}
    assert not by["save_atomic"]["ok"] and not by["relay_nothing_lost"]["ok"], data
    assert by["effects_once"]["ok"] and by["no_skip_out_of_order"]["ok"], data


# A queue that is right only where its hosts' REDIS_URL names the database of
# the client it is handed, as it does in the lab and in a harness of its own.
LANE_SNIFF = '''
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from alt_ttl_leases import *  # noqa: F401,F403 - a correct queue
from alt_ttl_leases import enqueue as _enqueue


def enqueue(r, payload, job_id):
    told = os.environ["REDIS_URL"].rsplit("db=", 1)[-1]
    if told != str(r.connection_pool.connection_kwargs.get("db", 0)):
        raise RuntimeError("a graded lane: its database is not the one I was told")
    return _enqueue(r, payload, job_id)
'''


def test_a_lane_s_hosts_are_told_their_own_database(tmp_path):
    """The lanes are forks of one harness; each lane's hosts must still be told
    the database of the lane, or a module could tell a graded lane from the
    lab and behave differently there."""
    from autograder.judges import queue_runs
    from handson.redis_server import EmbeddedRedis

    module = tmp_path / "myqueue.py"
    module.write_text(LANE_SNIFF)
    correct = notebook.REPO / "tests" / "corpus" / "queues" / "alt_ttl_leases.py"
    (tmp_path / "alt_ttl_leases.py").write_text(correct.read_text())
    server = EmbeddedRedis().start()
    try:
        lanes = [(f"{server.url}?db={db}", [name]) for db, name in (
            (2, "enqueue_idempotent"), (3, "bound_refuses"),
            (4, "claim_returns_payload_and_attempt"))]
        results, _ = queue_runs.contract_lanes(str(module), lanes, timeout=120)
    finally:
        server.stop()
    assert {n: r["ok"] for n, r in results.items()} == {
        name: True for _, [name] in lanes}, results
