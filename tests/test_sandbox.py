"""The sandbox, attacked for real: each test runs an attack in a confined process.

A confined process may write only in its work dir, read neither `solutions/`
nor `autograder/`, signal nothing outside its own tree, reach no TCP server and
no other run's Redis, and sees no secret of the grader's environment; memory,
disk and processes are one budget for the whole tree, and nothing it starts
outlives it, even when its supervisor is killed. On a machine without these
mechanisms (not Linux, no root and no user namespaces) the tests are skipped,
and the report says "isolation: none" or "partial".
"""

import ast
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import redis

from autograder.grade import grade
from autograder.isolation import confine, sandbox
from autograder.isolation.cgroup import Cgroup
from autograder.notebooks import notebook
from handson.redis_server import EmbeddedRedis

ROOT = notebook.REPO
PROBE = sandbox.isolation()
pytestmark = pytest.mark.skipif(
    PROBE.isolation != "full",
    reason=f"isolation on this machine: {PROBE.isolation} ({PROBE.tail(200)})")


def confined(tmp_path, code: str, *args: str, timeout: float = 30, **kw):
    """Run `code` as learner code with its own work dir under tmp_path."""
    work = tmp_path / "work"
    work.mkdir(parents=True, exist_ok=True)
    return sandbox.run([sys.executable, "-c", textwrap.dedent(code), *args],
                       timeout=timeout, cwd=work, confined=True, **kw)


def alive_with(marker: str) -> list[psutil.Process]:
    time.sleep(0.2)
    return [p for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])]


def tree_hash(*dirs: str) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path).encode() + path.read_bytes())
    return h.hexdigest()


def test_writes_only_in_its_work_dir(tmp_path):
    outside = tmp_path / "outside.txt"
    checks = ROOT / "autograder" / "judges" / "checks.py"
    before = checks.read_bytes()
    fin = confined(tmp_path, """
        import sys
        for target in sys.argv[1:]:
            try:
                open(target, "a").write("# owned")
                print("WROTE", target)
            except OSError as err:
                print("denied", type(err).__name__)
        open("mine.txt", "w").write("ok")
        """, str(outside), str(checks))
    assert fin.ok, fin.tail()
    assert "WROTE" not in fin.stdout and fin.stdout.count("denied") == 2
    assert not outside.exists() and checks.read_bytes() == before
    assert (tmp_path / "work" / "mine.txt").read_text() == "ok"
    assert fin.isolation == "full" and fin.protections["landlock"] >= 6


def test_the_kernel_may_read_its_runner_and_no_other_grader_file():
    """The kernel's read list: the notebook runner with the packages on its way,
    the handson modules the releases import, nothing else of the checkout."""
    files = [Path(f).relative_to(ROOT).as_posix() for f in sandbox.kernel_read_paths()]
    grader = {f for f in files if f.startswith("autograder/")}
    assert grader == {"autograder/__init__.py", "autograder/notebooks/__init__.py",
                      "autograder/notebooks/run_notebook.py",
                      "autograder/notebooks/writefile_cells.py"}, grader
    assert all(f.startswith("handson/") for f in set(files) - grader), files
    assert all((ROOT / f).is_file() for f in files)


def test_learner_code_starts_with_no_signal_blocked(tmp_path):
    """The sandbox's init waits for SIGCHLD with it blocked; the learner's
    process (and so a server it starts, which waits for its children by that
    signal) gets the mask it would have had without the sandbox."""
    fin = confined(tmp_path, """
        for line in open("/proc/self/status"):
            if line.startswith(("SigBlk", "SigIgn")):
                print(line.strip())
        """)
    assert fin.ok, fin.tail()
    masks = dict(line.split(":\t") for line in fin.stdout.splitlines())
    assert int(masks["SigBlk"], 16) == 0, masks
    assert not int(masks["SigIgn"], 16) & 1 << (signal.SIGCHLD - 1), masks


def test_a_quiet_run_says_nothing_on_stderr(tmp_path):
    """What a run writes on stderr is quoted as the reason it failed, so the
    supervisor and the launcher add nothing of their own there."""
    for confine_it in (True, False):
        fin = sandbox.run([sys.executable, "-c", "pass"], timeout=30,
                          cwd=tmp_path, confined=confine_it)
        assert fin.ok and fin.stderr == "" and fin.stdout == "", fin


def _parser_imports(path: Path, module: str) -> frozenset[str]:
    """The course modules a file imports, as Python's parser finds them."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                mod = f"{base}.{mod}" if mod else base
            mods = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        names |= {n for n in mods if n.split(".")[0] in ("handson", "autograder")
                  and n.count(".") >= 1}
    return frozenset(names)


def test_the_import_scan_finds_what_the_parser_finds():
    """The read lists come from a scan of import lines, not the parser: in every
    file of the course it finds the same imports (none from a script held in a
    string, none from a comment), or a sandbox would read more or too little."""
    differ = []
    for path in sorted(ROOT.glob("[ahst]*/**/*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in ("autograder", "handson", "solutions", "tests"):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        st = path.stat()
        scanned = sandbox._parsed_imports(str(path), module, st.st_mtime_ns,
                                          st.st_size)
        if scanned != _parser_imports(path, module):
            differ.append(str(rel))
    assert not differ, differ
    strings = ROOT / "autograder" / "judges" / "queue_runs.py"
    assert "from handson.queues.checks" in strings.read_text()
    assert "handson.queues.checks" not in _parser_imports(
        strings, "autograder.judges.queue_runs")


@pytest.mark.parametrize("source", [
    "import os; import handson.q\n",
    "if True: import handson.q\n",
    "try: from handson import q\nexcept ImportError: pass\n",
    "from handson \\\n    import q\n",
    "import handson.q, \\\n    handson.worker\n",
    "from handson.queues import (  # the (lab's) checks\n    checks,\n    cost)\n",
    "x = f\"{'a'}\"  # it's\nimport handson.q\n",
    '"""\nimport handson.secret\n"""\nrun = "from handson import worker"\n',
    "from . import q\nfrom .queues import checks as c, cost\n",
])
def test_the_import_scan_reads_every_form_of_import(tmp_path, source):
    path = tmp_path / "t.py"
    path.write_text(source)
    assert sandbox._parsed_imports(str(path), "handson.t", 0, 0) == \
        _parser_imports(path, "handson.t")


def test_cannot_read_solutions_tests_or_the_grader(tmp_path):
    secret = [ROOT / "solutions" / "claim_ack_reap" / "claim_ack_reap.ipynb",
              ROOT / "autograder" / "judges" / "checks.py",
              ROOT / "tests" / "conftest.py"]
    allowed = ROOT / "handson" / "q.py"
    fin = confined(tmp_path, """
        import sys
        for path in sys.argv[1:]:
            try:
                open(path).read()
                print("READ", path)
            except OSError as err:
                print("denied", type(err).__name__)
        """, *map(str, secret), str(allowed), read_paths=(str(allowed),))
    assert fin.ok, fin.tail()
    assert fin.stdout.count("denied") == 3, fin.stdout
    assert fin.stdout.count("READ") == 1 and str(allowed) in fin.stdout


def test_cannot_signal_outside_its_tree(tmp_path):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        fin = confined(tmp_path, """
            import os, signal, sys
            for pid in [int(sys.argv[1]), int(sys.argv[2]), 1, os.getppid()]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    print("KILLED", pid)
                except OSError as err:
                    print("denied", pid, type(err).__name__)
            """, str(victim.pid), str(os.getpid()))
        assert victim.poll() is None, "a process outside the sandbox was killed"
        assert "KILLED" not in fin.stdout, fin.stdout
        assert fin.returncode == 0, fin.tail()
    finally:
        victim.kill()
        victim.wait()


def test_no_tcp_to_a_server_on_loopback(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    fin = confined(tmp_path, """
        import socket, sys
        try:
            socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
            print("CONNECTED")
        except OSError as err:
            print("denied", type(err).__name__)
        """, str(port))
    server.setblocking(False)
    accepted = []
    with contextlib.suppress(BlockingIOError):
        accepted.append(server.accept())
    server.close()
    assert "denied" in fin.stdout and not accepted, fin.stdout + fin.stderr


def test_reaches_only_its_own_runs_redis(tmp_path):
    mine, other = EmbeddedRedis().start(), EmbeddedRedis().start()
    try:
        redis.Redis.from_url(other.url).set("victim", "intact")
        fin = confined(tmp_path, """
            import os, sys, redis
            print("own", redis.Redis.from_url(os.environ["REDIS_URL"]).ping())
            try:
                redis.Redis(unix_socket_path=sys.argv[1]).flushall()
                print("FLUSHED")
            except Exception as err:
                print("denied", type(err).__name__)
            """, str(other.socket), redis_url=mine.url)
        assert "own True" in fin.stdout, fin.tail()
        assert "denied" in fin.stdout and "FLUSHED" not in fin.stdout
        assert redis.Redis.from_url(other.url).get("victim") == b"intact"
    finally:
        mine.stop()
        other.stop()


def test_environment_is_scrubbed(tmp_path, monkeypatch):
    monkeypatch.setenv("EO_TEST_SECRET", "hunter2")
    fin = confined(tmp_path, "import os; print(sorted(os.environ.items()))")
    assert fin.ok and "hunter2" not in fin.stdout and "EO_TEST_SECRET" not in fin.stdout
    assert "'HOME'" in fin.stdout and str(tmp_path / "work") in fin.stdout


def test_memory_cap_is_shared_by_the_whole_tree(tmp_path):
    """Three children of 150 MB each fit any per-process limit, not a 300 MB tree."""
    fin = confined(tmp_path, """
        import subprocess, sys
        hog = "x = b'1' * (150 * 2**20); import time; time.sleep(3)"
        kids = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(3)]
        print("codes", [k.wait() for k in kids])
        """, tree_mem_mb=300)
    assert fin.oom_kills >= 1, fin.stdout + fin.tail()
    assert "-9" in fin.stdout, fin.stdout
    assert any("memory cap" in p for p in fin.problems())


def test_filling_the_disk_is_stopped_by_the_quota(tmp_path):
    start = time.monotonic()
    fin = confined(tmp_path, """
        import time
        chunk = b"0" * 2**20
        for i in range(400):
            with open(f"fill{i % 20}.bin", "ab") as fh:
                fh.write(chunk)
        print("FILLED")
        time.sleep(30)
        """, disk_mb=40, timeout=60)
    assert fin.disk_exceeded and "FILLED" not in fin.stdout
    assert time.monotonic() - start < 30
    assert any("disk quota" in p for p in fin.problems())


def test_detached_child_does_not_survive(tmp_path):
    marker = f"eo-detach-{os.getpid()}"
    fin = confined(tmp_path, f"""
        import subprocess
        subprocess.Popen(["bash", "-c", "exec -a {marker} sleep 300"],
                         start_new_session=True)
        subprocess.Popen(["bash", "-c", "(setsid sleep 301 {marker} &)"])
        """)
    assert fin.ok, fin.tail()
    assert any(marker in x for x in fin.leftovers), fin.leftovers
    assert not alive_with(marker)


def test_killing_the_supervisor_leaves_nothing_and_is_reported(tmp_path):
    marker = f"eo-superkill-{os.getpid()}"
    result = {}
    code = f"""
        import subprocess, time
        subprocess.Popen(["bash", "-c", "exec -a {marker} sleep 300"],
                         start_new_session=True)
        time.sleep(60)
        """
    t = threading.Thread(target=lambda: result.update(fin=confined(tmp_path, code)))
    t.start()
    deadline = time.monotonic() + 20
    while not alive_with(marker) and time.monotonic() < deadline:
        pass
    sups = [p for p in psutil.Process().children(recursive=True)
            if "autograder.isolation.sandbox" in " ".join(p.cmdline())]
    assert sups and alive_with(marker)
    for p in sups:
        p.send_signal(signal.SIGKILL)
    t.join(30)
    fin = result["fin"]
    assert fin.supervisor_killed == "signal 9" and not fin.timed_out
    assert any("supervisor was killed" in p for p in fin.problems())
    assert not alive_with(marker), "the detached child died with the supervisor"


def test_launchers_killed_as_they_start_leave_nothing_in_the_temp_dir(tmp_path):
    """A check's group is killed whenever it ends, often as a host starts: the
    kills sweep the launcher's first 0.4 s (its mount point was made then)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    cmd = [sys.executable, "-m", "autograder.isolation.confine", "--workdir",
           str(work), "--", sys.executable, "-c", "import time; time.sleep(30)"]
    for step in range(32):
        delay = 0.0125 * step
        launcher = subprocess.Popen(cmd, env=env, cwd=ROOT)
        time.sleep(delay)
        launcher.kill()
        launcher.wait(10)
    time.sleep(0.5)                 # the inits die with their launchers
    assert sorted(p.name for p in tmp.iterdir()) == [f"eo-view-{os.geteuid()}"]


# --- through the grader ------------------------------------------------------------

ATTACKS = [
    # rewrite the grader
    "import autograder, pathlib\n"
    "p = pathlib.Path('{root}/autograder/judges/checks.py')\n"
    "try:\n    p.write_text(p.read_text() + '\\nOWNED = 1\\n')\n"
    "except OSError as err:\n    print('could not write', err)",
    # kill the grader (its pid written into the cell) and the sandbox's init
    "import os, signal\n"
    "for pid in [{grader}, 1]:\n"
    "    try:\n        os.kill(pid, signal.SIGKILL)\n"
    "    except OSError as err:\n        print('could not kill', pid, err)",
    # detach a child, then fill the disk
    "import subprocess\n"
    "subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 300'],"
    " start_new_session=True)\n"
    "with open('fill.bin', 'wb') as fh:\n"
    "    for _ in range(200):\n        fh.write(b'0' * 2**20)",
]


def test_a_hostile_notebook_gets_a_report_and_changes_nothing(tmp_path, monkeypatch):
    """A notebook whose cells attack the grader: the grade still ends in a report."""
    marker = f"eo-hostile-{os.getpid()}"
    monkeypatch.setattr(sandbox, "DISK_MB", 50)
    src = notebook.read(ROOT / "exercises" / "delivery_semantics"
                        / "delivery_semantics.ipynb")
    for attack in ATTACKS:
        src.cells.append(nbformat.v4.new_code_cell(
            attack.format(root=ROOT, grader=os.getpid(), marker=marker)))
    path = tmp_path / "delivery_semantics.ipynb"
    nbformat.write(src, str(path))
    before = tree_hash("autograder", "handson", "solutions", "tests")
    result = grade(path, quick=True)
    assert tree_hash("autograder", "handson", "solutions", "tests") == before
    assert result.isolation == "full"
    report = result.text()
    assert "isolation: full" in report and "score 0/" in report
    assert any("disk quota" in p for p in result.problems), result.problems
    assert not alive_with(marker)


def test_learner_prefix_confines_a_host_and_cleanup_removes_the_run(tmp_path):
    """What a trusted harness uses: prefix + command, then cleanup(workdir)."""
    work = tmp_path / "run"
    work.mkdir()
    server = EmbeddedRedis().start()
    try:
        prefix = sandbox.learner_prefix(work, server.url)
        code = ("import os, redis; print(redis.Redis.from_url(os.environ['REDIS_URL'])"
                ".ping()); open(os.environ['EO_PROBE'], 'w')")
        res = subprocess.run(prefix + [sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=60,
                             env=dict(os.environ, EO_PROBE=str(tmp_path / "out")))
        assert res.stdout.strip() == "True", res.stderr[-1000:]
        assert "KeyError" in res.stderr, "EO_PROBE did not reach the learner"
        assert not (tmp_path / "out").exists()
    finally:
        server.stop()
    assert sandbox.cleanup(work) == []


def test_a_grading_run_s_cgroups_go_with_its_work_dir():
    """A judge's harness kills hosts (a check's group, a worker at a crash
    point); a launcher killed last cannot remove the run's cgroups."""
    from autograder import grade as grading

    with grading.run_dir("claim_ack_reap") as work:
        host = subprocess.Popen(sandbox.learner_prefix(work) + [
            sys.executable, "-c", "import time; time.sleep(60)"])
        cgroup = Cgroup(confine.run_id(str(work)))
        deadline = time.monotonic() + 20
        while not all(d.exists() for d in cgroup.dirs.values()):
            assert time.monotonic() < deadline, "the run's cgroups were never made"
            time.sleep(0.05)
        host.kill()
        host.wait(10)
        assert any(d.exists() for d in cgroup.dirs.values()), "left for run_dir"
    assert not any(d.exists() for d in cgroup.dirs.values())


def test_concurrent_runs_cannot_see_each_other(tmp_path):
    """Run A holds a file and a process; run B, at the same time, finds neither."""
    marker = f"eo-run-a-{os.getpid()}"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = threading.Thread(target=confined, args=(a_dir, f"""
        import time
        open("answer.txt", "w").write("A's work")
        time.sleep(8)  # {marker}
        """))
    a.start()
    deadline = time.monotonic() + 20
    while not (a_dir / "work" / "answer.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    fin = confined(b_dir, """
        import os, sys, psutil
        cmds = [" ".join(p.cmdline()) for p in psutil.process_iter()]
        print("seen", sum(sys.argv[2][::-1] in c for c in cmds), "of", len(cmds))
        for path in (sys.argv[1], os.path.dirname(sys.argv[1])):
            try:
                print("GOT", open(path).read() if path.endswith("txt")
                      else os.listdir(path))
            except OSError as err:
                print("denied", type(err).__name__)
        """, str(a_dir / "work" / "answer.txt"), marker[::-1])
    a.join()
    assert "seen 0 of" in fin.stdout and "GOT" not in fin.stdout, fin.stdout
    assert fin.stdout.count("denied") == 2, fin.stdout + fin.tail()


def test_learner_code_reads_no_file_only_its_owner_may(tmp_path):
    """As root, learner code is uid 0 without capabilities: owner rights would
    still open /etc/shadow (0640 root). The view covers such files with
    empty ones (a hostile review read it into a grade's feedback)."""
    private = [str(p) for p in Path("/etc").iterdir()
               if p.is_file() and not p.is_symlink()
               and not p.stat().st_mode & 0o004 and p.stat().st_size]
    if os.geteuid() != 0 or not private:
        pytest.skip("needs root and a non-empty file others may not read")
    fin = sandbox.run([sys.executable, "-c",
                       "import sys\nfor p in sys.argv[1:]:\n"
                       "    print(p, len(open(p, 'rb').read()))", *private],
                      timeout=60, cwd=tmp_path, confined=True)
    assert fin.returncode == 0, fin.tail()
    sizes = dict(line.rsplit(" ", 1) for line in fin.stdout.splitlines())
    assert sizes == {p: "0" for p in private}, sizes
