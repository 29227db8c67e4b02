"""The run's Redis is inside the sandbox: attacks through it, staged for real.

A grading run's server is confined like learner code (its own directory, no
network, a memory cap) and the learner's processes connect as a user that may
run only what a queue needs. Each attack here is one a submission made before
these protections: loading native code with MODULE LOAD, pointing the server's
dump at a file outside the run with CONFIG SET dir + SAVE, opening connections
with MIGRATE / REPLICAOF, filling the machine's memory, stopping or pausing the
server. Through `grade`, `nbgrader autograde` and `grade-class` the same
submission earns what a stub earns, changes nothing outside its folder, and is
told in one line per command what it ran.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import nbformat
import psutil
import pytest
import redis
from test_autograder import ROOT, _cli

from autograder.isolation import confine, server
from autograder.isolation.cgroup import Cgroup
from handson.redis_server import EmbeddedRedis, learner_url

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the confined server needs root (CI runs as root)")

# Each a command a queue never needs; every one is refused to the learner.
ADMIN = [("MODULE", "LOAD", "/nonexistent/evil.so"), ("CONFIG", "SET", "dir", "/"),
         ("CONFIG", "GET", "dir"), ("SAVE",), ("BGSAVE",), ("DEBUG", "SLEEP", "0"),
         ("MIGRATE", "127.0.0.1", "1", "k", "0", "100"), ("REPLICAOF", "NO", "ONE"),
         ("SLAVEOF", "NO", "ONE"), ("SHUTDOWN", "NOSAVE"), ("CLIENT", "PAUSE", "10"),
         ("CLIENT", "KILL", "TYPE", "normal"), ("FLUSHALL",), ("SWAPDB", "0", "1"),
         ("INFO", "server"), ("ACL", "LIST"), ("MONITOR",)]


@pytest.fixture
def box():
    s = server.start()
    yield s
    s.stop()


def _learner(s, db=0) -> redis.Redis:
    return redis.Redis.from_url(learner_url(s.url) + f"?db={db}", socket_timeout=5)


def test_learner_user_runs_a_queue_and_nothing_else(box):
    r = _learner(box, db=3)
    # What queues in the course use: scripts on the server's clock, transactions,
    # every data type, KEYS.
    assert r.eval("return redis.call('TIME')", 0)[0]
    sha = r.script_load("return redis.call('INCR', KEYS[1])")
    assert r.evalsha(sha, 1, "n") == 1
    with r.pipeline() as p:
        p.watch("n")
        p.multi()
        p.lpush("q", "a")
        p.hset("h", "f", "v")
        p.zadd("z", {"m": 1})
        p.execute()
    r.xadd("s", {"k": "v"})
    assert sorted(r.keys()) == [b"h", b"n", b"q", b"s", b"z"]
    for cmd in ADMIN:
        with pytest.raises(redis.exceptions.NoPermissionError):
            r.execute_command(*cmd)
    with pytest.raises(redis.ResponseError, match="can.t run this command"):
        r.eval("return redis.call('FLUSHALL')", 0)
    lines = box.refusals()
    named = {cmd[0] for cmd in ADMIN}
    assert {ln.split("command ")[1].split(":")[0] for ln in lines} == named
    assert all(ln.count("\n") == 0 and "not allowed" in ln for ln in lines)
    assert r.ping(), "the server is still up"


def test_only_the_two_users_get_in(box):
    anon = redis.Redis(unix_socket_path=str(box.socket), socket_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anon.ping()
    wrong = redis.Redis.from_url(learner_url(box.url).replace("learner:", "judge:"))
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()


def test_even_a_subverted_server_writes_nothing_outside_its_directory(box, tmp_path):
    """With every permission (as if a Lua bug had handed the server over), the
    dump still cannot land in a folder of the grader or in the course's Python."""
    judge = redis.Redis.from_url(box.url, socket_timeout=5)
    judge.set("k", "v")
    site = next(p for p in sys.path if p.endswith("site-packages"))
    for target in (tmp_path, site):
        try:
            with pytest.raises(redis.ResponseError):   # no such folder, or no write
                judge.config_set("dir", str(target))
                judge.config_set("dbfilename", "eo-door.rdb")
                judge.save()
        finally:
            planted = os.path.join(target, "eo-door.rdb")
            leaked = os.path.exists(planted)
            if leaked:
                os.unlink(planted)
        assert not leaked, f"the server wrote {planted}"
    assert box.proc.poll() is None, "the server is still up"


def test_the_server_reaches_no_one(box):
    """MIGRATE and REPLICAOF make a server connect out; ours has no network."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(3)
    port = listener.getsockname()[1]
    judge = redis.Redis.from_url(box.url, socket_timeout=10)
    judge.set("k", "v")
    with pytest.raises(redis.RedisError):
        judge.migrate("127.0.0.1", port, "k", 0, 1000)
    judge.replicaof("127.0.0.1", port)
    try:
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        judge.replicaof("NO", "ONE")
        listener.close()


def test_memory_in_the_server_is_capped(box):
    r = _learner(box)
    block = b"x" * (1 << 20)
    stored = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        for i in range(4 * server.MAXMEMORY_MB):
            r.set(f"k{i}", block)
            stored += 1
    assert stored <= server.MAXMEMORY_MB
    assert r.get("k0") == block, "what was stored is kept (no eviction)"


def _evil_so(tmp_path, marker):
    """A shared object that writes `marker` the moment it is loaded."""
    src = tmp_path / "evil.c"
    src.write_text('#include <stdio.h>\n__attribute__((constructor)) static void '
                   f'owned(void) {{ FILE *f = fopen("{marker}", "w"); '
                   'if (f) { fputs("owned", f); fclose(f); } }\n'
                   'int RedisModule_OnLoad(void *c, void **a, int n) '
                   '{ return 1; }\n')
    so = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_module_load_runs_native_code_only_in_an_unconfined_server(box, tmp_path):
    """The attack is real: a plain server runs the module's code as we are. The
    confined one cannot even see the file, with every permission."""
    marker = tmp_path / "owned.txt"
    so = _evil_so(tmp_path, marker)
    plain = EmbeddedRedis().start()
    try:
        with pytest.raises(redis.ResponseError):
            redis.Redis.from_url(plain.url).module_load(str(so))
    finally:
        plain.stop()
    assert marker.read_text() == "owned"
    marker.unlink()
    with pytest.raises(redis.ResponseError):
        redis.Redis.from_url(box.url).module_load(str(so))
    assert not marker.exists()


def test_a_stopped_server_leaves_nothing():
    s = server.start()
    pid = s.proc.pid
    children = psutil.Process(pid).children(recursive=True)
    assert any("redis-server" in " ".join(c.cmdline()) for c in children)
    s.stop()
    assert s.isolation.startswith("full") and "of its own" in s.isolation, \
        s.protections
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                   for c in children)
    cg = Cgroup(confine.run_id(str(s.dir)))
    assert not any(d.exists() for d in cg.dirs.values())
    assert not s.dir.exists()


# --- a whole submission that attacks through its Redis --------------------------

def attacker(dest, victim) -> str:
    """The released claim_ack_reap notebook (stubs) whose module, on import,
    tries every door: native code, the victim's file, the network, the server."""
    nb = nbformat.read(str(ROOT / "exercises" / "claim_ack_reap" /
                           "claim_ack_reap.ipynb"), 4)
    cell = next(c for c in nb.cells if c.source.startswith("%%writefile myqueue.py"))
    attack = f"""
import os as _os, redis as _redis
def _try(*cmd):
    try:
        _redis.Redis.from_url(_os.environ["REDIS_URL"]).execute_command(*cmd)
    except Exception:
        pass
_try("MODULE", "LOAD", _os.path.abspath("evil.so"))
_try("CONFIG", "SET", "dir", {str(victim.parent)!r})
_try("CONFIG", "SET", "dbfilename", {victim.name!r})
_try("SAVE")
_try("MIGRATE", "127.0.0.1", "6379", "k", "0", "100")
_try("REPLICAOF", "127.0.0.1", "6379")
_try("FLUSHALL")
_try("CLIENT", "PAUSE", "60000")
_try("SHUTDOWN", "NOSAVE")
"""
    cell.source = cell.source.rstrip() + "\n" + attack
    path = dest / "claim_ack_reap.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


REFUSED = ("MODULE", "CONFIG", "SAVE", "MIGRATE", "REPLICAOF", "FLUSHALL", "CLIENT",
           "SHUTDOWN")


def test_an_attacking_queue_earns_what_a_stub_earns(tmp_path):
    """Through `grade`; `nbgrader autograde` grades the same notebook in
    test_grading_trust, and `grade-class` in test_grade_class (its classmate's
    notebook is the target there)."""
    victim = tmp_path / "classmate" / "claim_ack_reap.ipynb"
    victim.parent.mkdir()
    shutil.copy(ROOT / "solutions" / "claim_ack_reap" / "claim_ack_reap.ipynb",
                victim)
    before = victim.read_bytes()
    path = attacker(tmp_path / "eve", victim)
    page = tmp_path / "feedback.html"
    res = _cli("grade", str(path), "--json", "--quick", "--html", str(page))
    data = json.loads(res.stdout)
    assert data["score"] == 0, [c["name"] for c in data["checks"] if c["ok"]]
    assert_refused(data["problems"])
    html = page.read_text()       # the same grade, as a page the learner opens
    assert f"claim_ack_reap: 0/{data['max_score']}" in html
    assert "Redis command MODULE: not allowed" in html
    assert data["server_isolation"].startswith("full; runs as uid")
    assert victim.read_bytes() == before


def assert_refused(problems: list[str]) -> None:
    """Each door the attacker tried is named in one line of the report."""
    for name in REFUSED:
        assert any(f"Redis command {name}: not allowed" in p for p in problems), (
            name, problems)
