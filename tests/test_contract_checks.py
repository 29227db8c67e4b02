"""The contract checks catch what they name, survive bad modules, and read no keys.

Each broken queue is the reference `handson/q.py` with ONE deliberate mistake,
written to a temporary file, so a check that fails can only be reacting to that
mistake. (The reference itself passes every check: tests/test_queue.py.)
"""

import json
import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import handson.q
from handson.faults import timeline
from handson.queues import checks, crowds
from handson.queues.checkbase import NOT_JUDGED
from handson.queues.checks import run_checks
from handson.redis_server import RedisUnavailable

SOURCE = Path(handson.q.__file__).read_text()


def _lua_override(script: str, lua: str) -> str:
    return f'\n{script} = _Script(_NOW + """\n{lua}\n""")\n'


# name -> (edits to the source: (old, new) pairs or text to append, check that fails)
BROKEN = {
    "ack_without_attempt_check": (
        [("if tonumber(job[1]) ~= tonumber(attempt)", "if false")],
        ["zombie_ack_refused", "owner_ack_after_zombie"]),
    "extend_without_attempt_check": (
        _lua_override("_extend", """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
return 1"""), ["zombie_extend_refused"]),
    "extend_without_xx": (
        _lua_override("_extend", """
if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1"""), ["extend_does_not_resurrect"]),
    "extend_forgets_now": (
        [("redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])",
          "redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[3]), ARGV[1])")],
        ["heartbeat_keeps_lease"]),
    "fail_without_attempt_check": (
        [("""  return 0
end
redis.call('HSET', KEYS[2], 'e:'""", """  -- (no fencing)
end
redis.call('HSET', KEYS[2], 'e:'""")], ["zombie_fail_refused"]),
    "enqueue_not_idempotent": (
        [("if redis.call('HEXISTS', KEYS[2], 'p:' .. id) == 1 then return 0 end",
          "")],
        ["enqueue_idempotent"]),
    "enqueue_forgets_done": (
        [("if done and tonumber(done) >= now - tonumber(ARGV[4]) then return 0 end",
          "")], ["enqueue_idempotent"]),
    "no_bound": (
        [("if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -1 end",
          "")], ["bound_refuses"]),
    "claim_does_not_count": (
        [("local n = redis.call('HINCRBY', jobs, 'a:' .. id, 1)",
          "redis.call('HSETNX', jobs, 'a:' .. id, 1)\n"
          "local n = tonumber(redis.call('HGET', jobs, 'a:' .. id))")],
        ["attempt_grows"]),
    "payload_not_decoded": (
        [("return _text(i), json.loads(p) if p else {}, int(a)",
          "return _text(i), p, int(a)")],
        ["claim_returns_payload_and_attempt"]),
    "reap_takes_live_leases": (
        [("'-inf', now,\n", "'-inf', '+inf',\n")], ["reap_requeues_expired"]),
    "killed_attempt_not_counted": (
        [("  if used >= tonumber(ARGV[1]) then",
          "  if lease == 0 and used >= tonumber(ARGV[1]) then")],
        ["poison_to_dlq_with_reason", "killed_attempt_counts"]),
    "reap_in_python_not_atomic": ('''
def reap(r, max_attempts=3):
    sec, usec = r.time()
    now = sec * 1000 + usec // 1000
    requeued = dead_n = 0
    for job_id, lease in r.zrangebyscore(INFLIGHT, "-inf", now, withscores=True):
        job_id = _text(job_id)
        r.zrem(INFLIGHT, job_id)
        if lease != 0:
            r.hset(JOBS, f"e:{job_id}", LEASE_EXPIRED)
        else:
            r.hdel(JOBS, f"f:{job_id}")
        used = (int(r.hget(JOBS, f"a:{job_id}") or 0)
                - int(r.hget(JOBS, f"b:{job_id}") or 0))
        if used >= max_attempts:
            r.zadd(DLQ, {job_id: now})
            dead_n += 1
        else:
            r.lpush(PENDING, job_id)
            requeued += 1
    return requeued, dead_n
''', ["reap_atomic_concurrent"]),
    "claim_peek_then_remove": ('''
def claim(r, lease_s):
    job_id = r.lindex(PENDING, -1)
    if job_id is None:
        return None
    job_id = _text(job_id)
    r.lrem(PENDING, -1, job_id)
    n = r.hincrby(JOBS, f"a:{job_id}", 1)
    sec, usec = r.time()
    r.zadd(INFLIGHT, {job_id: sec * 1000 + usec // 1000 + _ms(lease_s)})
    return job_id, json.loads(r.hget(JOBS, f"p:{job_id}")), n
''', ["claim_atomic_concurrent"]),
    "claim_in_two_round_trips": ('''
_claim_rest = _Script(_NOW + """
local n = redis.call('HINCRBY', KEYS[2], 'a:' .. ARGV[1], 1)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if n > 1 then redis.call('ZREM', KEYS[3], ARGV[1]) end
return {n, redis.call('HGET', KEYS[2], 'p:' .. ARGV[1])}""")


def claim(r, lease_s):
    job_id = r.rpop(PENDING)            # a kill between these two steps loses it
    if job_id is None:
        return None
    n, p = _claim_rest(r, (INFLIGHT, JOBS, WAITING), (job_id, _ms(lease_s)))
    return _text(job_id), json.loads(p), int(n)
''', ["claim_atomic_concurrent"]),
}


def _write(tmp_path: Path, name: str, edits) -> str:
    source = SOURCE
    if isinstance(edits, str):
        source += edits
    else:
        for old, new in edits:
            assert source.count(old) == 1, f"{name}: the edit no longer applies"
            source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return str(path)


@pytest.mark.parametrize("variant,check", [
    (variant, check) for variant, (_, checks) in BROKEN.items() for check in checks])
def test_broken_queue_fails_the_named_check(variant, check, tmp_path, redis_url):
    spec = _write(tmp_path, variant, BROKEN[variant][0])
    [res] = run_checks(spec, redis_url, [check])
    assert res.name == check
    assert not res.ok, f"{variant} passed {check}: {res.got}"
    assert res.got and res.hint and res.expected


def test_a_claimer_that_never_gets_going_fails_the_kill_check(tmp_path, redis_url):
    """Each process's first claim waits longer than the check waits for a
    claimer: no kill lands, and the check says so instead of passing with
    "no job lost to kills" on none."""
    path = _slow_start(tmp_path, crowds.STILL_S + 1)
    [res] = run_checks(str(path), redis_url, ["claim_atomic_concurrent"])
    assert not res.ok and "0 of 24 SIGKILLs landed" in res.got, res.got


def _slow_start(tmp_path, seconds: float) -> Path:
    """The reference queue whose first claim in each process sleeps `seconds`,
    and leaves a file claimer-PID in tmp_path."""
    path = tmp_path / "slow_start.py"
    path.write_text(SOURCE + f'''

_started = [None]
_reference_claim = claim


def claim(r, lease_s, **kw):
    import os
    import time
    if _started[0] != os.getpid():
        _started[0] = os.getpid()
        open(os.path.join({str(tmp_path)!r}, f"claimer-{{os.getpid()}}"), "w").close()
        time.sleep({seconds})
    return _reference_claim(r, lease_s, **kw)
''')
    return path


def test_another_key_layout_passes_every_check(tmp_path, redis_url):
    """The checks read no key names: rename every key and the queue still passes."""
    source = SOURCE.replace('TAG = "{q}"', 'TAG = "{learner}"')
    for key in ("pending", "inflight", "payload", "attempts", "dlq", "done"):
        source = source.replace(f'f"{{TAG}}:{key}"', f'f"{{TAG}}:my_{key}"')
    path = tmp_path / "other_layout.py"
    path.write_text(source)
    results = run_checks(str(path), redis_url)
    assert [x.name for x in results] == list(checks.CHECKS)
    assert all(x.ok for x in results), "\n".join(x.line() for x in results if not x.ok)


BAD_MODULES = {
    "raises_on_import": ("raise RuntimeError('no config')", "RuntimeError"),
    "syntax_error": ("def claim(r, lease_s)\n    pass", "syntax error"),
    "missing_functions": ("def claim(r, lease_s):\n    return None", "no function"),
}


@pytest.mark.parametrize("name", list(BAD_MODULES))
def test_a_module_that_cannot_load_is_a_clear_failure(name, tmp_path, redis_url):
    source, words = BAD_MODULES[name]
    path = tmp_path / f"{name}.py"
    path.write_text(source + "\n")
    [res] = run_checks(str(path), redis_url, ["enqueue_idempotent"])
    assert not res.ok and words in res.got


def _with_claim(body: str) -> str:
    return SOURCE + f"\n\ndef claim(r, lease_s):\n{body}\n"


def test_a_raising_function_is_a_failure_not_a_crash(tmp_path, redis_url):
    path = tmp_path / "raises.py"
    path.write_text(_with_claim("    raise KeyError('lease')"))
    [res] = run_checks(str(path), redis_url, ["claim_returns_payload_and_attempt"])
    assert not res.ok and "KeyError" in res.got


def test_a_hanging_check_is_stopped_at_its_timeout(tmp_path, redis_url):
    path = tmp_path / "hangs.py"
    path.write_text(_with_claim("    import time\n    time.sleep(600)"))
    [res] = run_checks(str(path), redis_url, ["attempt_grows"], timeout=1.5)
    assert not res.ok and "no answer after 1.5 s" in res.got
    assert multiprocessing.active_children() == []


def test_a_module_that_exits_is_a_failure(tmp_path, redis_url):
    path = tmp_path / "exits.py"
    path.write_text(_with_claim("    import os\n    os._exit(7)"))
    [res] = run_checks(str(path), redis_url, ["attempt_grows"])
    assert not res.ok and "exited with code 7" in res.got


def test_unknown_check_name_and_absent_redis(redis_url):
    with pytest.raises(ValueError, match="unknown check"):
        run_checks("handson.q", redis_url, ["no_such_check"])
    with pytest.raises(RedisUnavailable, match="127.0.0.1:1"):
        run_checks("handson.q", "redis://127.0.0.1:1/0", ["attempt_grows"])


def _cli(*args, env_url: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "REDIS_URL": env_url}
    return subprocess.run([sys.executable, "-m", "handson.queues.checks", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_cli_exit_codes_and_json(tmp_path, redis_url):
    ok = _cli("handson.q", "--only", "enqueue_idempotent", "--json", env_url=redis_url)
    assert ok.returncode == 0, ok.stderr
    [row] = json.loads(ok.stdout)
    assert row["name"] == "enqueue_idempotent" and row["ok"] is True
    spec = _write(tmp_path, "no_bound", BROKEN["no_bound"][0])
    bad = _cli(spec, "--only", "bound_refuses", env_url=redis_url)
    assert bad.returncode == 1
    assert "FAIL bound_refuses" in bad.stdout and "hint:" in bad.stdout


QUEUES = Path(__file__).parent / "corpus" / "queues"


def test_deadline_from_the_workers_clock_loses_only_that_check(redis_url):
    """mini_correct with claim's deadline from time.time(): one more check fails,
    the one that names it."""
    # every check but the three slowest (claim, reap and renewal under load)
    names = [n for n in checks.CHECKS if n not in (
        "claim_atomic_concurrent", "reap_atomic_concurrent", "heartbeat_keeps_lease")]
    base = {x.name for x in run_checks(str(QUEUES / "mini_correct.py"), redis_url,
                                       names) if not x.ok}
    results = run_checks(str(QUEUES / "worker_clock.py"), redis_url, names)
    failed = {x.name for x in results if not x.ok}
    assert failed - base == {"deadline_from_server_clock"}, "\n".join(
        x.line() for x in results if not x.ok)
    assert base - failed == set()
    [res] = [x for x in results if x.name == "deadline_from_server_clock"]
    assert "1 h behind" in res.got and "TIME" in res.hint


def test_an_extend_on_the_workers_clock_fails_the_clock_check(tmp_path, redis_url):
    path = tmp_path / "extend_clock.py"
    path.write_text(f"import sys\nimport time\nsys.path.insert(0, {str(QUEUES)!r})\n"
                    "from mini_correct import *\n\n\n"
                    "def extend(r, job_id, attempt, lease_s):\n"
                    "    return bool(lua(r, HELD + \"\"\"\n"
                    "    redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[3]), ARGV[1])"
                    "\n    return 1\"\"\", (INFLIGHT, JOB), "
                    "(job_id, attempt, time.time() + lease_s)))\n")
    [res] = run_checks(str(path), redis_url, ["deadline_from_server_clock"])
    assert not res.ok and "called extend" in res.got


def test_clock_skew_moves_the_wall_clocks_only():
    """EO_CLOCK_SKEW_S shifts time.time, time_ns and datetime.now, not sleeps."""
    code = ("import datetime, time\n"
            "t, m = time.time(), time.monotonic()\n"
            "from handson.infra.learner_module import load\n"
            "load('json')\n"
            "print(round(time.time() - t), round(time.time_ns() / 1e9 - t),\n"
            "      round(datetime.datetime.now().timestamp() - t),\n"
            "      round(time.monotonic() - m))\n")
    env = {**os.environ, "EO_CLOCK_SKEW_S": "-3600"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.stdout.split() == ["-3600", "-3600", "-3600", "0"], out.stderr


def test_a_stopped_ack_names_its_schedule_the_same_way_every_run(redis_url):
    """The interleaving check is deterministic: the same wrong ack, the same
    schedule and words twice; the hint says what to change."""
    spec = str(QUEUES / "ack_check_then_act.py")
    first, second = (run_checks(spec, redis_url, ["interleavings"])[0]
                     for _ in range(2))
    assert not first.ok and first.got == second.got, (first.got, second.got)
    assert "ack stopped after Redis reply" in first.got
    assert "meanwhile reap and claim ran" in first.got
    assert "attempt 2 holds the job" in first.got
    assert "ONE round trip" in first.hint and "WATCH/MULTI" in first.hint
    assert first.timeline == second.timeline
    assert first.witnessed == []     # chaos counts no ack overtaken mid-call
    _drawn_as_run(first, "ack", "stop")


def test_a_reap_killed_between_its_scripts_loses_the_jobs(redis_url):
    [res] = run_checks(str(QUEUES / "reap_two_trips.py"), redis_url,
                       ["killed_between_replies"])
    assert not res.ok and "reap was killed after Redis reply 1" in res.got
    assert "lost" in res.got and "ONE round trip" in res.hint
    assert res.witnessed == ["lost"]        # the chaos check follows it
    _drawn_as_run(res, "reap", "kill")


def test_reapers_that_requeue_one_expiry_twice_show_the_double_hand_out(redis_url):
    """What the grader's chaos checks take from a failure: the same job handed
    to several holders at once, and claimed more often than max_attempts."""
    [res] = run_checks(str(QUEUES / "reap_not_atomic.py"), redis_url,
                       ["reap_atomic_concurrent"])
    assert not res.ok and "times at once" in res.got, res.got
    assert set(res.witnessed) == {"handed_out_twice", "over_delivered"}


FORGETS_ACKED = '''
import sys
sys.path.insert(0, {folder!r})
from reap_not_atomic import *


def ack(r, job_id, attempt):
    """Deletes the job's record, as the solution's ack does: a copy put back
    twice then starts its attempts at 1 again."""
    return bool(lua(r, HELD + """
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('DEL', jk)
    return 1""", (INFLIGHT, JOB), (job_id, attempt)))
'''


def test_a_double_requeue_of_a_job_acked_then_forgotten_lets_its_zombie_ack(
        tmp_path, redis_url):
    """A stale ack the chaos run shows only when a zombie wakes after two
    reapers, an ack and a claim of the copy: the interleaving that put the job
    back twice, played once more, shows it on every run, and only where the
    queue forgets the acked job (the corpus's keeps it, marked done)."""
    forgets = tmp_path / "forgets_acked.py"
    forgets.write_text(FORGETS_ACKED.format(folder=str(QUEUES)))
    [res] = run_checks(str(forgets), redis_url, ["interleavings"])
    assert not res.ok and re.search(r"attempt 1's late ack of job-\d returned True",
                                    res.got), res.got
    assert set(res.witnessed) == {"handed_out_twice", "stale_ack_accepted"}
    [res] = run_checks(str(QUEUES / "reap_not_atomic.py"), redis_url,
                       ["interleavings"])
    assert not res.ok and res.witnessed == ["handed_out_twice"], res.got


def _drawn_as_run(res, fn: str, held: str) -> None:
    """The failing schedule's picture: the call's replies up to the stop (or
    kill) the failure names, then the other client's calls as the failure
    reports them, then the rest of the call's replies; one step ringed."""
    tl = res.timeline
    assert tl and tl["invariant"] == res.name and tl["sentence"] == res.got
    k, of = re.search(rf"{fn} (?:stopped|was killed) after Redis reply (\d+)"
                      r"(?: of its (\d+))?", res.got).groups()
    lane = tl["lanes"][0]
    kinds = [m["kind"] for m in tl["marks"]]
    assert [m["t"] for m in tl["marks"]] == list(range(len(kinds)))
    assert kinds[:int(k) + 1] == ["reply"] * int(k) + [held]
    rival = [m for m in tl["marks"] if m["lane"] == "another client"]
    assert rival and all(m["t"] > int(k) for m in rival)
    for m in rival:            # each step of the other client, as reported
        said = re.split(r" returned | got | as ", m["text"])[-1]
        assert said in res.got, (m["text"], res.got)
    after = [m for m in tl["marks"] if m["lane"] == lane and m["t"] > int(k)]
    if held == "stop":
        assert [m["kind"] for m in after] == ["reply"] * (int(of) - int(k)) + [
            "returned"]
        assert f"{fn}(attempt 1) returned {after[-1]['text'].split()[-1]}" \
            in res.got
    else:
        assert not after
    bad = [m for m in tl["marks"] if m["bad"]]
    assert len(bad) == 1 and bad[0]["lane"] == lane
    picture = timeline.svg(tl)
    assert picture.count('<g class="mark"') == len(kinds)
    assert picture.count("data-bad") == 1 and tl["title"] in picture



def test_a_producer_killed_mid_enqueue_and_retried_must_queue_the_job(redis_url):
    """The producer is a role too: killed between its round trips, its retry
    with the same id finds the job written and never queues it."""
    [res] = run_checks(str(QUEUES / "enqueue_two_trips.py"), redis_url,
                       ["killed_between_replies"])
    assert not res.ok and "enqueue was killed after Redis reply" in res.got
    assert "claims then got []" in res.got and "ONE round trip" in res.hint


def test_an_optimistic_claim_that_gives_up_fails_the_concurrent_check(redis_url):
    """None while jobs are pending is a wrong answer, not only a slow one."""
    [res] = run_checks(str(QUEUES / "claim_watch_gives_up.py"), redis_url,
                       ["claim_atomic_concurrent"])
    assert not res.ok and "a claim returned None when" in res.got, res.got
    assert "try again" in res.hint


DEAF = f'''
import sys

sys.path.insert(0, {str(QUEUES)!r})
import ack_check_then_act as base
from ack_check_then_act import *

HOST = sys.modules["__main__"]          # the learner host runs as a script


def ack(r, job_id, attempt):            # unarms the grader's stop, then acks
    armed = getattr(HOST, "_ARMED", None)
    if armed is not None:
        armed.pause = None
    return base.ack(r, job_id, attempt)
'''


def test_a_module_that_unarms_the_stop_fails_instead_of_passing(tmp_path,
                                                                redis_url):
    path = tmp_path / "deaf.py"
    path.write_text(DEAF)
    [res] = run_checks(str(path), redis_url, ["interleavings"])
    assert not res.ok and "ack changed the database, yet its process never " \
        "stopped" in res.got, res.got


def test_a_module_that_unarms_the_kill_fails_instead_of_passing(tmp_path,
                                                                redis_url):
    path = tmp_path / "immortal.py"
    path.write_text(DEAF.replace("ack_check_then_act", "claim_two_trips")
                    .replace("armed.pause = None", "armed.after = None")
                    .replace("def ack(r, job_id, attempt):", "def claim(r, lease_s):")
                    .replace("base.ack(r, job_id, attempt)", "base.claim(r, lease_s)"))
    [res] = run_checks(str(path), redis_url, ["killed_between_replies"])
    assert not res.ok and "claim was to be killed after Redis reply 1" in res.got \
        and "yet it returned" in res.got, res.got


def test_the_other_clients_step_is_ringed_when_it_broke_the_rule(tmp_path,
                                                                redis_url):
    """A claim that never counts attempts: the stopped ack is not to blame, the
    other client's claim (attempt 1 again) is the step the picture rings."""
    spec = _write(tmp_path, "no_count", BROKEN["claim_does_not_count"][0])
    [res] = run_checks(spec, redis_url, ["interleavings"])
    assert not res.ok and "not above 1" in res.got, res.got
    bad = [m for m in res.timeline["marks"] if m["bad"]]
    assert len(bad) == 1 and bad[0]["lane"] == "another client", bad
    assert bad[0]["text"].endswith("as attempt 1")


STALLING = SOURCE.replace("def extend(", "def _extend_now(", 1) + '''

import os, signal, subprocess
_calls = {}


def extend(r, job_id, attempt, lease_s, *, queue="q"):
    """Stops the whole process group past the lease at the third beat of a
    job, then refuses: the lease ran out while it was stopped."""
    key = (job_id, attempt)
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] == 3 and len(_calls) <= STALLED_JOBS:
        group = os.getpgid(0)
        subprocess.Popen(["sh", "-c", f"sleep 0.7; kill -CONT -{group}"],
                         start_new_session=True)
        os.killpg(group, signal.SIGSTOP)
        time.sleep(0.1)             # the stop reaches this thread in that time
        return False
    return _extend_now(r, job_id, attempt, lease_s, queue=queue)
'''


def test_a_trial_stopped_past_the_lease_is_run_again(tmp_path, redis_url):
    """A lease lost after no extend began for a whole lease may be the
    machine's doing: such a trial is set aside and the next one judged."""
    path = tmp_path / "stalled.py"
    path.write_text(STALLING + "\nSTALLED_JOBS = 2\n")
    [res] = run_checks(str(path), redis_url, ["heartbeat_keeps_lease"])
    assert res.ok and res.got.startswith("never reaped"), res
    # Its own two stalls at least; a loaded machine may stall one more.
    set_aside = re.search(r"(\d+) trial\(s\) before it set aside", res.got)
    assert set_aside and int(set_aside[1]) >= 2, res


def test_a_process_stopped_in_every_trial_is_judged_on_the_last(tmp_path,
                                                                 redis_url):
    """Stopping itself earns nothing: the last trial's loss would go unjudged
    as the machine's, but the runner saw the check's process stopped by a
    signal, and the check fails."""
    path = tmp_path / "stalls_always.py"
    path.write_text(STALLING + "\nSTALLED_JOBS = 99\n")
    [res] = run_checks(str(path), redis_url, ["heartbeat_keeps_lease"])
    assert not res.ok and "3 trial(s) before it set aside" in res.got, res
    assert res.got.startswith("not judged: "), res
    assert "stopped by a signal meanwhile" in res.got, res


def test_an_extend_slow_on_its_own_is_judged(tmp_path, redis_url):
    """An extend that sleeps before it runs is late by its own doing, not the
    machine's: the lease runs out and the check fails, naming the slow extend."""
    path = tmp_path / "slowbeat.py"
    path.write_text(SOURCE.replace("def extend(", "def _extend_now(", 1) + '''

def extend(r, job_id, attempt, lease_s, *, queue="q"):
    time.sleep(0.45)
    return _extend_now(r, job_id, attempt, lease_s, queue=queue)
''')
    for _ in range(3):      # a machine too busy to judge says so: asked again
        [res] = run_checks(str(path), redis_url, ["heartbeat_keeps_lease"])
        if not res.got.startswith(NOT_JUDGED):
            break
    assert not res.ok and "extend took" in res.got, res


def test_a_check_stopped_at_its_limit_leaves_no_claimer_behind(tmp_path, redis_url):
    """The kill test's claimers lead process groups of their own (so that a
    kill reaches their hosts too); a check stopped at its limit still takes
    them along, not leaving them to claim forever."""
    import time

    import psutil

    path = _slow_start(tmp_path, 3)
    [res] = run_checks(str(path), redis_url, ["claim_atomic_concurrent"], timeout=6)
    assert "no answer after 6 s" in res.got, res.got
    time.sleep(0.5)
    pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("claimer-*")]
    assert pids, "no claimer started"
    left = [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_only_a_hole_the_chaos_run_can_reach_is_witnessed(redis_url):
    """A failed job's comeback is no chaos invariant the graded run surely
    reaches (its workers call fail only for a payload they cannot read: each
    poison document kills its worker); an expired job claimed past
    max_attempts is one."""
    names = ["poison_to_dlq_with_reason"]
    [by_fail] = run_checks(str(QUEUES / "fail_requeues_extend_zadd.py"), redis_url,
                           names)
    [by_reap] = run_checks(str(QUEUES / "poison_never_counts.py"), redis_url, names)
    assert not by_fail.ok and "'bad'" in by_fail.got and by_fail.witnessed == []
    assert not by_reap.ok and "'poison'" in by_reap.got, by_reap.got
    assert by_reap.witnessed == ["over_delivered"]
