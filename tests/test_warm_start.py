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
