"""The embedded Redis: starts, stops, never outlives its parent, fails clearly."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from handson import q
from handson.faults import durability
from handson.redis_server import (
    FSYNC_CHOICES,
    EmbeddedRedis,
    RedisUnavailable,
    cli_redis,
    connect,
    find_binary,
    redis_url,
)

BAD_URL = "redis://127.0.0.1:1/0"


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


def _redis_children(parent: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        if ppid == parent and name.startswith("redis-server"):
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def server():
    s = EmbeddedRedis().start()
    try:
        yield s
    finally:
        s.stop()


def test_start_answers_and_stop_cleans_up():
    s = EmbeddedRedis().start()
    try:
        client = connect(s.url)
        assert client.ping()
        major, minor = map(int, client.info("server")["redis_version"].split(".")[:2])
        assert (major, minor) >= (6, 2)
        client.close()
        pid = s.pid
        assert not _gone(pid)
    finally:
        s.stop()
    assert _gone(pid)
    assert not s.dir.exists()


def test_redis_url_is_honoured(server, monkeypatch):
    monkeypatch.setenv("REDIS_URL", server.url)
    before = _redis_children(os.getpid())
    with redis_url() as url:
        assert url == server.url
        assert _redis_children(os.getpid()) == before      # no second server
        connect(url).set("mark", "1")
    assert connect(server.url).get("mark") == b"1"


def test_without_redis_url_a_private_server_comes_and_goes(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    before = set(_redis_children(os.getpid()))
    with redis_url() as url:
        assert connect(url).ping()
        started = set(_redis_children(os.getpid())) - before
        assert len(started) == 1
    assert _wait_gone(started.pop())


CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ.pop("REDIS_URL", None)
    from handson.redis_server import EmbeddedRedis, connect
    s = EmbeddedRedis().start()
    try:
        print(s.pid, s.dir, flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("answers after Ctrl-C:", connect(s.url).ping(), flush=True)
    finally:
        s.stop()
""")


def _as_in_a_terminal():
    """Ctrl-C as a terminal delivers it, even when pytest itself was started
    in the background (where the shell hands children an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_parent_killed_or_interrupted_leaves_no_server(sig):
    """SIGKILL the parent alone; or Ctrl-C its whole process group, as a terminal
    does: the server must not see that SIGINT (Python stops it after cleanup)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             text=True, start_new_session=True,
                             preexec_fn=_as_in_a_terminal)
    pid, where = None, None
    try:
        line = child.stdout.readline().split()
        pid, where = int(line[0]), Path(line[1])
        assert not _gone(pid)
        os.killpg(child.pid, sig)
        child.wait(10)
        assert _wait_gone(pid), f"redis-server {pid} outlived its parent ({sig.name})"
        if sig == signal.SIGINT:
            assert child.stdout.read().strip() == "answers after Ctrl-C: True"
            assert not where.exists()                       # a clean stop
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if pid and not _gone(pid):
            os.kill(pid, signal.SIGKILL)
        if where:
            shutil.rmtree(where, ignore_errors=True)


def test_absent_redis_is_a_clear_message(monkeypatch):
    with pytest.raises(RedisUnavailable, match="127.0.0.1:1.*REDIS_URL"):
        connect(BAD_URL)
    with pytest.raises(RedisUnavailable, match="not a Redis URL"):
        connect("localhost:6379")
    monkeypatch.setenv("REDIS_URL", BAD_URL)
    with pytest.raises(RedisUnavailable, match="Cannot reach Redis"):
        with redis_url():
            pass


def _run(code_or_args, env_url: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    if env_url:
        env["REDIS_URL"] = env_url
    args = code_or_args if isinstance(code_or_args, list) else ["-c", code_or_args]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("cli", [["handson.queues.checks", "handson.q"],
                                 ["handson.chaos", "2", "--docs", "10"],
                                 ["handson.q", "stats"]])
def test_cli_with_a_bad_redis_url_prints_one_line_and_exits_3(cli):
    res = _run(["-m", *cli], env_url=BAD_URL)
    assert res.returncode == 3
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and BAD_URL in res.stderr
    assert res.stderr.startswith("error: Cannot reach Redis")


def test_cli_when_redis_dies_mid_run_prints_one_line_and_exits_3():
    res = _run(textwrap.dedent("""
        from handson import q
        from handson.redis_server import EmbeddedRedis, cli_redis, connect
        with cli_redis():
            s = EmbeddedRedis().start()
            r = connect(s.url)
            q.enqueue(r, {}, "a")
            s.kill()
            q.claim(r, 1)
    """))
    assert res.returncode == 3, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.startswith("error: lost the connection to Redis")


def test_cli_redis_in_process(capsys):
    with pytest.raises(SystemExit) as exit_info, cli_redis():
        connect(BAD_URL)
    assert exit_info.value.code == 3
    assert "Cannot reach Redis at " + BAD_URL in capsys.readouterr().err


@pytest.mark.parametrize("fsync", FSYNC_CHOICES)
def test_durability_setting_is_applied(fsync):
    s = EmbeddedRedis(appendfsync=fsync).start()
    try:
        client = connect(s.url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": fsync}
        q.enqueue(client, {"n": 1}, "kept")
        client.close()
        s.restart()                                          # kill -9, replay AOF
        client = connect(s.url)
        if fsync == "always":
            assert q.claim(client, 30) == ("kept", {"n": 1}, 1)
        client.close()
    finally:
        s.stop()


def test_bad_durability_setting():
    with pytest.raises(ValueError, match="appendfsync must be one of"):
        EmbeddedRedis(appendfsync="sometimes")
    with pytest.raises(ValueError, match="setting must be one of"):
        durability.acknowledged_lost("sometimes")


def test_kill_the_server_always_loses_no_acknowledged_enqueue():
    row = durability.acknowledged_lost("always", seconds=0.3)
    assert row["acknowledged"] > 0
    assert row["lost"] == 0


def test_kill_the_server_without_aof_loses_every_enqueue():
    row = durability.acknowledged_lost("off", seconds=0.3)
    assert row["acknowledged"] > 0
    assert row["lost"] == row["acknowledged"] and row["recovered"] == 0


def test_a_newer_redis_server_on_path_is_preferred(tmp_path, monkeypatch):
    bundled = find_binary()
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'Redis server v=99.0.0 sha=0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert find_binary() == str(fake)
    fake.write_text("#!/bin/sh\necho 'Redis server v=1.0.0 sha=0'\n")
    assert find_binary() == bundled
