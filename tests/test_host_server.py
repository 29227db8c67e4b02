"""Confined hosts forked from the run's warm server: the same sandbox, nothing more.

A host's launcher is a fork of a server that imported redis-py once (as root,
straight into a PID namespace the server made, whose init it is), and the
learner's code runs in that confined process without a fresh interpreter. So
the learner can read a copy of the server's memory: it must hold nothing the
learner may not have (the judge's password above all), and the process must be
what exec made it (no capability left, Landlock in force, the caller's process
group, which a SIGKILL of the group reaches). Run for real, with the run's own
confined Redis.
"""

import os
import secrets
import signal
import textwrap
import time
from urllib.parse import urlsplit

import psutil
import pytest

from autograder.isolation import sandbox, server
from handson.infra import remote_module, warm_start
from handson.redis_server import learner_url

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the confined server needs root (CI runs as root)")

SPY = textwrap.dedent('''
    import os

    def scan(*halves):
        """How often each needle is in this process's readable memory. Each
        comes in two halves, joined here: whole, it is only where this made it
        (or where it was before the call), never in the call's own buffers."""
        encoded = [(a + b).encode() for a, b in halves]
        found = [0] * len(encoded)
        with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if not perms.startswith("r") or "[vvar" in line:
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    chunk = mem.read(hi - lo)
                except (OSError, ValueError, OverflowError):
                    continue
                for i, needle in enumerate(encoded):
                    found[i] += chunk.count(needle)
        return found

    def status():
        caps = {}
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Cap"):
                    key, value = line.split(":")
                    caps[key] = int(value, 16)
        return caps

    def escape(path):
        try:
            with open(path, "w") as fh:
                fh.write("out")
            return "written"
        except OSError as err:
            return type(err).__name__

    def hang():
        import time
        time.sleep(60)

    def pids():
        return [os.getpid(), os.getppid()]

    def sizes(*paths):
        """What this process can read of each path: its size, or the error."""
        out = []
        for path in paths:
            try:
                with open(path, "rb") as fh:
                    out.append(len(fh.read()))
            except OSError as err:
                out.append(type(err).__name__)
        return out
''')


@pytest.fixture
def run(tmp_path):
    s = server.start()
    work = tmp_path / "work"
    work.mkdir()
    spy = work / "spy.py"
    spy.write_text(SPY)
    prefix = sandbox.learner_prefix(work, s.url, (str(spy), remote_module.HOST))
    yield s, spy, prefix
    for key in [k for k in remote_module._HOSTS if k == str(work)]:
        remote_module._HOSTS.pop(key)[1].close()
    sandbox.cleanup(work)
    s.stop()


def test_a_forked_host_holds_no_secret_of_the_judge(run, tmp_path, monkeypatch):
    s, spy, prefix = run
    monkeypatch.setenv("REDIS_URL", s.url)      # as the harness has it
    judge = urlsplit(s.url).password
    learner = urlsplit(learner_url(s.url)).password
    m = remote_module.load(str(spy), prefix)
    other = remote_module.load(str(spy), prefix)     # a second host, same server
    try:
        assert isinstance(m._host.proc, warm_start.WarmProcess)
        assert isinstance(other._host.proc, warm_start.WarmProcess)
        # Each needle is whole in memory where the scan joined it: a random one
        # of the same length, passed alike, is found as often as the judge's
        # password, and the learner's (its REDIS_URL) more often: the scan sees
        # memory. (Passed whole, each was also in as many of the call's buffers
        # as the allocator happened to leave, and a preloaded module more in the
        # server moved them.)
        control = secrets.token_hex(len(judge) // 2)
        for host in (m, other):
            judged, controlled, learned = host.scan(
                *((x[:8], x[8:]) for x in (judge, control, learner)))
            assert judged == controlled >= 1 and learned > controlled
        caps = m.status()
        assert caps["CapEff"] == caps["CapPrm"] == caps["CapInh"] == 0, caps
        assert caps["CapBnd"] == 0, caps
        outside = tmp_path / "outside.txt"
        assert m.escape(str(outside)) != "written" and not outside.exists()
        # The server of hosts made the host's PID namespace, and its fork is the
        # namespace's init: no launcher waits outside. Both are in our group.
        init = psutil.Process(m._host.proc.pid)
        tree = [init, *init.children(recursive=True)]
        workdir = prefix[prefix.index("--workdir") + 1]
        assert init.ppid() == remote_module._HOSTS[workdir][1].proc.pid
        assert len(tree) == 2 and m.pids() == [2, 1]    # the init, the learner
        assert {os.getpgid(p.pid) for p in tree} == {os.getpgrp()}
    finally:
        m.close()
        other.close()


def test_a_forked_host_reads_no_file_only_its_owner_may(run, tmp_path):
    """Each host forked from the run's server covers what only its owner may
    read, also a file made so after the server started (a review read such a
    file when the server found them once, before its first fork)."""
    from pathlib import Path

    _, spy, prefix = run
    first = remote_module.load(str(spy), prefix)        # the server is up
    late = Path("/etc") / f"eo-test-{secrets.token_hex(4)}"
    try:
        late.write_text("not for learners\n")
        late.chmod(0o600)
        private = [str(p) for p in Path("/etc").iterdir()
                   if p.is_file() and not p.is_symlink()
                   and not p.stat().st_mode & 0o004 and p.stat().st_size]
        hosts = [remote_module.load(str(spy), prefix) for _ in range(2)]
        for host in hosts:
            assert isinstance(host._host.proc, warm_start.WarmProcess)
            sizes = host.sizes(*private)
            assert all(size in (0, "PermissionError", "FileNotFoundError")
                       for size in sizes), dict(zip(private, sizes, strict=True))
        for host in hosts:
            host.close()
    finally:
        late.unlink(missing_ok=True)
        first.close()


def test_a_killed_group_takes_its_forked_host(run):
    """SIGKILL of the caller's group reaches the host, as a real worker's crash
    does, while the server (in our group) lives on: a forked caller whose host
    is in a call that never returns."""
    _, spy, prefix = run
    server_of_hosts = remote_module._host_server(prefix[prefix.index("--workdir") + 1],
                                                 prefix, dict(os.environ))
    pid = os.fork()
    if pid == 0:                        # the caller: its own group, our session
        os.setpgid(0, 0)
        try:
            remote_module.load(str(spy), prefix).hang()
        finally:
            os._exit(0)
    host = None
    deadline = time.monotonic() + 30
    while host is None and time.monotonic() < deadline:
        host = _child_host(pid)
        time.sleep(0.05)
    assert host, "the caller's host never started"
    time.sleep(0.5)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while _alive(host) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(host)
    assert not server_of_hosts.gone


def _child_host(caller: int) -> int | None:
    """A process in the caller's group that is not the caller: its host."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != caller:
            try:
                if os.getpgid(int(entry)) == caller:
                    return int(entry)
            except OSError:
                continue
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
