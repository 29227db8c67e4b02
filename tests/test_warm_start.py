"""Workers forked from the run's warm-start server behave as `python -m` ones do.

Each is a real process of its own session, with its own environment, argv and
log; its exit code reads as Popen's (SIGKILL: -9); nothing it started
outlives the server, and a server that is gone starts nothing.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from handson.infra import warm_start
from handson.infra.worker_process import Worker, open_gate

SCRIPT = """import os, sys
print("argv", sys.argv[1:], "env", os.environ.get("EO_TEST"), "sid",
      os.getsid(0) == os.getpid(), flush=True)
if sys.argv[1] == "sleep":
    import time; time.sleep(60)
if sys.argv[1] == "leave":      # what the interpreter's exit must still do
    import atexit, threading, time
    atexit.register(lambda: print("atexit ran"))
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread ran"))).start()
    sys.stdout.write("unflushed ")
    sys.exit(4)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


@pytest.fixture
def starter(tmp_path, monkeypatch):
    (tmp_path / "eo_probe.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    s = warm_start.Starter(str(tmp_path))
    yield s
    s.close()


def _start(s, tmp_path, arg: str):
    env = dict(os.environ, EO_TEST=arg)
    return s.start("eo_probe", [arg], env, str(tmp_path / "log"))


def test_exit_codes_argv_env_and_log_as_python_dash_m(starter, tmp_path):
    p = _start(starter, tmp_path, "3")
    assert p.wait(timeout=30) == 3 and p.poll() == 3
    assert _start(starter, tmp_path, "0").wait(timeout=30) == 0
    assert _start(starter, tmp_path, "bye").wait(timeout=30) == 1   # sys.exit("bye")
    log = (tmp_path / "log").read_text()
    assert "argv ['3'] env 3 sid True" in log and "bye" in log
    real = subprocess.run([sys.executable, "-m", "eo_probe", "3"], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(
                              os.environ, EO_TEST="3", PYTHONPATH=str(tmp_path)))
    assert real.returncode == 3 and "argv ['3'] env 3 sid False" in real.stdout


def test_a_worker_leaves_as_the_interpreter_would(starter, tmp_path):
    """Its threads are joined, its atexit functions run and its buffers are
    written, in the order a fresh interpreter's exit has them (the modules are
    not torn down: in a fork that cost 60 ms of CPU a worker)."""
    assert _start(starter, tmp_path, "leave").wait(timeout=30) == 4
    real = subprocess.run([sys.executable, "-m", "eo_probe", "leave"], cwd=tmp_path,
                          capture_output=True, text=True, env=dict(
                              os.environ, PYTHONPATH=str(tmp_path)))
    assert real.returncode == 4
    tail = "unflushed thread ran\natexit ran\n"
    assert real.stdout.endswith(tail)
    assert (tmp_path / "log").read_text().endswith(tail)


def test_sigkill_reads_as_popen_and_a_closed_server_leaves_nothing(starter, tmp_path):
    p = _start(starter, tmp_path, "sleep")
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.2)
    os.killpg(p.pid, signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    left = _start(starter, tmp_path, "sleep")
    deadline = time.monotonic() + 30     # named before it runs the module
    while (tmp_path / "log").read_text().count("argv ['sleep']") < 2:
        assert time.monotonic() < deadline, (tmp_path / "log").read_text()
        time.sleep(0.05)
    assert open(f"/proc/{left.pid}/comm").read().strip() == "eo_probe"
    starter.close()
    assert left.wait(timeout=30) == -signal.SIGKILL
    assert starter.start("eo_probe", ["0"], dict(os.environ), None) is None


def test_a_killed_server_takes_its_workers_with_it(starter, tmp_path):
    p = _start(starter, tmp_path, "sleep")
    starter.proc.kill()
    deadline = time.monotonic() + 30
    while warm_start._alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.wait(timeout=30) == -signal.SIGKILL


NAMESPACED = """import os, sys
sys.stdin.read()
print(os.getpid(), os.getppid(), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")
def test_a_child_in_a_pid_namespace_of_its_own_and_the_next_in_ours(tmp_path,
                                                                   monkeypatch):
    """With pid_namespace the child is PID 1 of a namespace the server made
    for it, in the caller's process group all the same (whose number it cannot
    see); the server's next child is in the server's namespace again."""
    (tmp_path / "eo_ns.py").write_text(NAMESPACED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    s = warm_start.Starter(str(tmp_path))
    try:
        logs = [tmp_path / f"log{i}" for i in range(3)]
        with open(logs[0], "w") as out:
            first = s.start_piped("eo_ns", [], dict(os.environ), {0: "r"},
                                  {1: out.fileno()}, pgid=os.getpgrp(),
                                  pid_namespace=True)
        assert os.getpgid(first.pid) == os.getpgrp()
        os.close(first.ends[0])                 # it may go on
        assert first.wait(30) == 0
        for log in logs[1:]:
            assert s.start("eo_ns", [], dict(os.environ), str(log)).wait(30) == 0
    finally:
        s.close()
    said = [log.read_text().split() for log in logs]
    assert said[0] == ["1", "0"]                # its parent is outside
    assert all(pid != "1" and int(parent) == s.proc.pid for pid, parent in said[1:])


IN_USER_NAMESPACE = """import os, sys
from handson.infra import warm_start
s = warm_start.Starter("userns")
codes = [s.start("eo_ns", [], dict(os.environ), None, pid_namespace=True).wait(30)
         for _ in range(2)]
print(codes, s.proc.poll())
s.close()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")
def test_root_of_a_user_namespace_gets_no_pid_namespace_and_its_server_lives(
        tmp_path):
    """There a PID namespace can be made but not left (setns back is refused):
    the server made one, then died (exit 70) at its first child, and every
    host after it started a server again. It makes none there now."""
    (tmp_path / "eo_ns.py").write_text(NAMESPACED.replace("sys.stdin.read()\n", ""))
    run = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable,
                          "-c", IN_USER_NAMESPACE], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert run.stdout.strip() == "[0, 0] None", run.stdout + run.stderr


def test_a_reply_that_comes_too_late_answers_no_later_start(tmp_path, monkeypatch):
    """A start that stopped waiting for its server (still importing what it
    preloads) got nothing; the server's late reply once answered the next
    start instead, whose caller then waited on the wrong process. Now the late
    one is killed, and each start gets its own."""
    (tmp_path / "eo_slow_import.py").write_text("import time\ntime.sleep(1.5)\n")
    (tmp_path / "eo_probe.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    s = warm_start.Starter(str(tmp_path), preload=("eo_slow_import",))
    try:
        monkeypatch.setattr(warm_start, "START_TIMEOUT_S", 0.3)
        env = dict(os.environ)
        assert s.start("eo_probe", ["sleep"], env, str(tmp_path / "log")) is None
        monkeypatch.setattr(warm_start, "START_TIMEOUT_S", 30.0)
        second = s.start("eo_probe", ["7"], env, str(tmp_path / "log"))
        assert second.args[-1] == "7" and second.wait(30) == 7
        deadline = time.monotonic() + 10
        while s.live and time.monotonic() < deadline:   # the late one, killed
            time.sleep(0.05)
        assert not s.live
    finally:
        s.close()


def test_a_fork_that_fails_is_an_error_reply_and_leaks_nothing(monkeypatch):
    """The server answers and serves on (it raised, and took its children with
    it), with no pipe left open."""
    import socket

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fds_before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", no_fork)
    warm_start._fork({"id": 3, "module": "x", "args": [], "pid_namespace": True},
                     [], theirs, {})
    monkeypatch.undo()
    assert set(os.listdir("/proc/self/fd")) - fds_before <= {
        str(fd) for fd in warm_start._OWN_PID_NS}       # opened once, kept
    reply = __import__("json").loads(ours.recv(4096))
    assert reply["id"] == 3 and reply["error"].startswith("fork:")
    ours.close()
    theirs.close()


PRELOADED = """import sys
if __name__ == "__main__":
    print("main", sys.argv, __spec__.name, sys.modules["__main__"].__dict__ is
          globals(), "VERSION", flush=True)
    sys.exit(int(sys.argv[1]))
"""


def test_a_preloaded_module_runs_as_python_dash_m_from_the_servers_code(
        tmp_path, monkeypatch):
    """A module the server preloaded runs as __main__ with `python -m`'s argv,
    from the code the server compiled: the file changed after the server
    started is not read again, and nothing is imported or warned of anew."""
    source = tmp_path / "eo_pre.py"
    source.write_text(PRELOADED.replace("VERSION", "v1"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    log = tmp_path / "log"
    s = warm_start.Starter(str(tmp_path), preload=("eo_pre",))
    try:
        assert s.start("eo_pre", ["3"], dict(os.environ), str(log)).wait(30) == 3
        source.write_text(PRELOADED.replace("VERSION", "v2"))
        assert s.start("eo_pre", ["0"], dict(os.environ), str(log)).wait(30) == 0
    finally:
        s.close()
    real = subprocess.run([sys.executable, "-m", "eo_pre", "0"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert real.stdout == f"main ['{source}', '0'] eo_pre True v2\n"
    assert log.read_text() == "".join(f"main ['{source}', '{arg}'] eo_pre True v1\n"
                                      for arg in ("3", "0"))


ENV_READS = """import importlib, os, sys
root, seen = sys.argv[1], set()
class Watched(dict):
    def _note(self, key):
        frame = sys._getframe(2)
        while frame.f_globals.get("__name__") == "os":     # os.getenv
            frame = frame.f_back
        where = os.path.relpath(frame.f_code.co_filename, root)
        if os.path.isabs(frame.f_code.co_filename) and \\
                not where.startswith(("..", ".venv")):
            seen.add(f"{where}:{key}")
    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)
    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)
os.environ = Watched(os.environ)
for name in sys.argv[2:]:
    importlib.import_module(name)
print(" ".join(sorted(seen)))
"""


def test_what_a_server_preloads_reads_no_environment_when_imported():
    """A fork runs with an environment of its own, but what a module read of
    the environment when the server imported it was the server's: a worker's
    ITERS, read by handson.work at import, was once the server's, not the
    worker's. The server reads PYTHONPATH for its own path, which each child
    sets anew. (The graders' server is started with the grades' environment.)"""
    from autograder.isolation import sandbox
    from autograder.judges import heartbeat_trial
    from handson.faults.pool import WORKER_PRELOAD
    from handson.infra import remote_module

    preloaded = {*warm_start.PRELOAD, *WORKER_PRELOAD, *remote_module.HOST_PRELOAD,
                 *remote_module.PG_PRELOAD, *sandbox.SUPERVISOR_PRELOAD,
                 *heartbeat_trial._PRELOAD}
    repo = Path(warm_start.__file__).resolve().parents[2]
    read = subprocess.run([sys.executable, "-c", ENV_READS, str(repo),
                           *sorted(preloaded)], capture_output=True, text=True,
                          check=True, cwd=repo).stdout.split()
    assert read == ["handson/infra/warm_start.py:PYTHONPATH"]


GATED = """import json, sys
from handson.infra.worker_process import wait_gate
wait_gate(int(sys.argv[1]), 30)
print(json.dumps({"gated": True}), flush=True)
"""


def test_a_forked_worker_gets_its_pipes_and_its_gate(tmp_path, monkeypatch):
    """worker_process.Worker: stdout and stderr on pipes, the gate's fd passed
    at the same number, as Popen's pass_fds does."""
    (tmp_path / "eo_gated.py").write_text(GATED)
    monkeypatch.chdir(tmp_path)
    read_fd, write_fd = os.pipe()
    w = Worker("eo_gated", [str(read_fd)], pass_fds=(read_fd,),
               env={"PYTHONPATH": str(tmp_path)})
    try:
        assert isinstance(w.proc, warm_start.WarmProcess)
        w.expect("ready", 30)
        open_gate(write_fd, 1)
        assert w.result(30) == {"gated": True}
        assert w.proc.returncode == 0
    finally:
        os.close(read_fd)
        os.close(write_fd)
        w.close()



INTERRUPTED = """import os, signal, sys, time
from handson.infra import warm_start
signal.signal(signal.SIGINT, lambda *_: print("caller interrupted", flush=True))
s = warm_start.ours("interrupted")
child = s.start("eo_probe", ["sleep"], dict(os.environ), sys.argv[1],
                pgid=os.getpgid(0))
time.sleep(1)
os.killpg(0, signal.SIGINT)          # as a kernel's interrupt reaches its group
print("child ended", child.wait(timeout=30) in (1, -signal.SIGKILL), flush=True)
print("server", s.proc.wait(timeout=30), flush=True)
deadline = time.monotonic() + 30
while not s.gone and time.monotonic() < deadline:
    time.sleep(0.05)
again = warm_start.ours("interrupted").start("eo_probe", ["5"], dict(os.environ), None)
print("next", again.wait(timeout=30), flush=True)
"""


def test_an_interrupt_of_the_callers_group_ends_its_server_without_a_word(
        tmp_path):
    """The interrupt ends the server and what it started, as it always did, but
    prints no traceback; the caller's next start gets a new server."""
    (tmp_path / "eo_probe.py").write_text(SCRIPT)
    res = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(tmp_path / "log")], cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path])),
        capture_output=True, text=True, timeout=120, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert res.stdout.splitlines() == ["caller interrupted", "child ended True",
                                       f"server {-signal.SIGINT}", "next 5"], (
        res.stdout + res.stderr)
    assert res.stderr == ""
