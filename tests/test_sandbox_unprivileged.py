"""The sandbox without root: what a grader run by an ordinary user still gets.

As root, the tests re-run the attacks in a user namespace where the grader's
uid is 1000 (`unshare --user --map-user`), so the sandbox takes the path an
unprivileged grader takes: namespaces through a user namespace of its own, no
cgroup (memory and processes fall back to per-process rlimits), Landlock as
before. The report must say so ("partial: no cgroup"), and every attack that
does not need a cgroup to stop it must still fail.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from autograder.notebooks import notebook

ROOT = notebook.REPO

# Runs inside the user namespace: each attack in a confined process, one JSON
# line of what happened.
ATTACKS = r'''
import json, os, sys, subprocess, textwrap, time
from autograder.isolation import sandbox

work, outside, secret, victim, port = sys.argv[1:6]
os.makedirs(work, exist_ok=True)

def confined(code, **kw):
    return sandbox.run([sys.executable, "-c", textwrap.dedent(code)], timeout=60,
                       cwd=work, confined=True, **kw)

out = {"euid": os.geteuid()}
fin = confined("""
    import os, signal, socket
    for name, act in [
            ("write", lambda: open(%r, "a").write("owned")),
            ("read", lambda: open(%r).read()),
            ("signal", lambda: os.kill(%d, signal.SIGKILL)),
            ("tcp", lambda: socket.create_connection(("127.0.0.1", %d), timeout=2))]:
        try:
            act()
            print("DONE", name)
        except OSError as err:
            print("denied", name, type(err).__name__)
    subprocess = __import__("subprocess")
    subprocess.Popen(["sleep", "300.0731"], start_new_session=True)
    """ % (outside, secret, int(victim), int(port)))
out.update(isolation=fin.isolation, stdout=fin.stdout, leftovers=fin.leftovers,
           protections=fin.protections, returncode=fin.returncode)
fin = confined("x = b'1' * (400 * 2**20); print('ALLOCATED')", tree_mem_mb=200)
out["memory"] = {"stdout": fin.stdout, "returncode": fin.returncode}
print(json.dumps(out))
'''


def _user_namespace_works() -> str | None:
    """Why this test cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to map an ordinary uid (the suite's own runs are that)"
    if not shutil.which("unshare"):
        return "no unshare(1)"
    res = subprocess.run(["unshare", "--user", "--map-user=1000", "--map-group=1000",
                          "id", "-u"], capture_output=True, text=True)
    if res.stdout.strip() != "1000":
        return f"user namespaces are not available: {res.stderr.strip()}"
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="Linux namespaces")
def test_unprivileged_grader_reports_partial_and_still_stops_the_attacks(tmp_path):
    why = _user_namespace_works()
    if why:
        pytest.skip(why)
    outside = tmp_path / "outside.txt"
    secret = ROOT / "solutions" / "claim_ack_reap" / "claim_ack_reap.ipynb"
    victim = subprocess.Popen(["sleep", "60"])
    server = socket.create_server(("127.0.0.1", 0))
    try:
        res = subprocess.run(
            ["unshare", "--user", "--map-user=1000", "--map-group=1000",
             sys.executable, "-c", textwrap.dedent(ATTACKS), str(tmp_path / "work"),
             str(outside), str(secret), str(victim.pid),
             str(server.getsockname()[1])],
            cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert victim.poll() is None, "a process outside the sandbox was killed"
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
        victim.kill()
        victim.wait()
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["euid"] == 1000
    assert got["isolation"] == "partial: no cgroup", got
    assert got["protections"]["landlock"] >= 1 and got["protections"]["namespaces"]
    for attack in ("write", "read", "signal", "tcp"):
        assert f"denied {attack}" in got["stdout"], got["stdout"]
    assert "DONE" not in got["stdout"] and not outside.exists()
    assert any("300.0731" in x for x in got["leftovers"]), got["leftovers"]
    # Without a cgroup, memory is capped per process (RLIMIT_AS), not per tree.
    assert "ALLOCATED" not in got["memory"]["stdout"], got["memory"]
    assert got["memory"]["returncode"] != 0
