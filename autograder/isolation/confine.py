"""The trusted launcher that confines one learner process tree, then execs it.

    python -m autograder.isolation.confine --workdir W [--read PATH]...
        [--redis-url URL] [--pg-url URL]
        [--mem-mb N] [--pids N] [--cpus N] [--disk-mb N] [--env K=V]...
        [--pass NAME]... [--keep-group] [--identity NAME] [--status F]
        [--no-exec] [--init] -- CMD...

Three processes, only the last runs learner code (two with --init, below):

- the launcher puts itself in the run's cgroup (one memory, process and CPU cap
  for every learner process of a grading run, named after the work dir), enters new
  mount, PID, network and IPC namespaces, and waits;
- the namespace's init (PID 1) builds a file system view that holds only the
  Python installation, system libraries, the explicit read paths (read-only),
  the run's own Redis and PostgreSQL socket directories and the work dir
  (writable); it watches the work dir's size (the disk quota), and when the
  command ends it lists what is still running (leftovers), then exits, and the
  kernel kills everything left in the namespace, detached or not;
- the learner process drops every capability, restricts itself with Landlock
  (write only in the work dir, no TCP, no signal outside its tree), gets a
  scrubbed environment and rlimits, and execs CMD. With --no-exec (the
  launcher is a fork of a run's warm server of hosts, which imported redis-py
  once and holds nothing a learner may not read) a CMD that is this Python
  running a script runs it in place instead, after dropping the capabilities
  exec would have dropped.

With --init, in a PID namespace its caller made and whose PID 1 it is (a host
forked by a run's server of hosts, as root), the launcher enters the network
and IPC namespaces itself and is the init: the fork and the waiting launcher
cost a host a fifth of its start.

With --identity NAME (a server: PostgreSQL refuses to run as root) the command
runs as a user of its own: as root, a uid that no account and no other run has
(`identity_uid`), owner of the work dir and named NAME in the view's
/etc/passwd, so one run's server can neither read another's files nor signal
its processes; otherwise the caller's own uid inside its user namespace.
SIGINT and SIGTERM sent to the launcher reach the command (a server's fast and
smart shutdown), so it can stop cleanly and the status still be written.

The run's cgroup is `cgroup.Cgroup`; the namespaces and the view are built by
`view`; Landlock is `landlock`. Each mechanism is used when the machine has it;
the status file says which were in force. Without a network namespace nothing
listens for us, and a jupyter kernel must use IPC transport (files in the work
dir), not TCP.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from stat import S_ISDIR
from urllib.parse import parse_qs, unquote, urlsplit

from autograder.isolation import landlock
from autograder.isolation.cgroup import Cgroup, account
from autograder.isolation.view import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    DEVICES,
    SYSTEM_READ,
    _check,
    _libc,
    _unshare,
    build_view,
    loopback_up,
)

# Every confined process starts a launcher: `hashlib` (OpenSSL), `socket` and
# `platform` were a third of its imports, for one digest, one ioctl and one name.
try:
    from _sha256 import sha256
except ImportError:                       # Python 3.12+: _sha2; or only OpenSSL
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256

_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_CHILD_SUBREAPER = 1, 24, 36
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, _CAP_VERSION_3 = 47, 4, 0x20080522


def run_id(workdir: str) -> str:
    """The name every process of one grading run shares (its cgroup's name)."""
    return "eo-" + sha256(os.path.realpath(workdir).encode()).hexdigest()[:16]


IDENTITY_BASE, IDENTITY_SPAN = 1 << 30, 1 << 24


def identity_uid(workdir: str) -> int:
    """The uid (and gid) a run's server gets as root: from the run's name, in a
    range far above any account's (2^30 + 24 bits), so two runs do not share it."""
    digest = sha256(os.path.realpath(workdir).encode()).digest()
    return IDENTITY_BASE + int.from_bytes(digest[:3], "big") % IDENTITY_SPAN


def python_paths() -> list[str]:
    """The interpreter, its standard library and the site-packages in use."""
    paths = {sys.base_prefix, sys.prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    paths |= {p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)}
    return sorted(paths)


def redis_dir(redis_url: str | None) -> str | None:
    """The directory of a unix:// Redis socket (a TCP URL is unreachable here)."""
    if redis_url and redis_url.startswith("unix://"):
        return os.path.dirname(unquote(urlsplit(redis_url).path))
    return None


def pg_dir(pg_url: str | None) -> str | None:
    """The socket directory of a PostgreSQL URL (`?host=/dir`; TCP: None)."""
    if not pg_url:
        return None
    host = parse_qs(urlsplit(pg_url).query).get("host", [""])[0]
    return host if host.startswith("/") else None


# --- the namespace's init ------------------------------------------------------------

DU_EVERY_S = 0.25           # how often the init measures the work dir


def _du(path: str, limit_entries: int = 200_000) -> int:
    """Bytes used under path (allocated blocks); huge file counts count as full."""
    total, seen, stack = 0, 0, [path]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for entry in it:
                seen += 1
                if seen > limit_entries:
                    return 1 << 62
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def _processes(pidns: bool) -> list[tuple[int, str]]:
    """What still runs: every process in our PID namespace, else our descendants."""
    procs, parent = [], {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{d}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")
            procs.append((int(d), cmd.decode(errors="replace").strip()[:160]))
    if pidns:
        return procs

    def mine(pid: int) -> bool:
        for _ in range(64):
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
            if pid <= 1:
                return False
        return False
    return [(p, c) for p, c in procs if mine(p)]


def _kill_all(pidns: bool) -> list[tuple[int, int]]:
    """SIGKILL everything that still runs; the (pid, status) pairs reaped."""
    reaped = []
    for _ in range(20):
        left = _processes(pidns)
        if not left:
            break
        if pidns:
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
        reaped += _reap()
    return reaped + _reap()


def _reap() -> list[tuple[int, int]]:
    done = []
    with contextlib.suppress(ChildProcessError):
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            done.append((pid, status))
    return done


def _code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def init(opts, cmd: list[str], mode: str, report_fd: int) -> int:
    """PID 1 of the sandbox: build the view, start the learner, watch, clean up."""
    pidns = bool(mode)
    if pidns:
        build_view(opts.root, view_read(opts), [opts.workdir],
                   (opts.identity, opts.uid) if opts.uid else None)
        os.write(report_fd, b'{"view_ready": true}\n')    # the launcher removes root
        loopback_up()
    else:
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # A child's end wakes us (SIGCHLD, held pending until we wait for it), so
    # the only timer left is the disk quota's: a poll every 20 ms cost a host
    # that lived 5 s as much CPU as its start.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        become_learner(opts, cmd, mode, report_fd)
    _forward_stops(child)
    quota = opts.disk_mb * 1024 * 1024
    code, disk_exceeded, next_du = None, False, 0.0
    while code is None:
        for pid, status in _reap():
            if pid == child:
                code = _code(status)
        if code is None:
            if time.monotonic() >= next_du:
                next_du = time.monotonic() + DU_EVERY_S
                if _du(opts.workdir) >= quota:
                    disk_exceeded = True
                    for pid, status in _kill_all(pidns):
                        if pid == child:
                            code = _code(status)
                    continue
            signal.sigtimedwait({signal.SIGCHLD},
                                max(0.0, next_du - time.monotonic()))
    # A write stopped at the size limit may end the run before a poll saw it.
    used = _du(opts.workdir)
    disk_exceeded = disk_exceeded or used >= quota
    leftovers = [f"{pid}: {cmdline}" for pid, cmdline in _processes(pidns)]
    _kill_all(pidns)
    if disk_exceeded:
        leftovers = []
    os.write(report_fd, (json.dumps({"leftovers": leftovers,
                                     "disk_exceeded": disk_exceeded,
                                     "disk_used_mb": used >> 20}) + "\n")
             .encode())
    return code


def _forward_stops(pid: int) -> None:
    """SIGINT and SIGTERM reach `pid` (the launcher forwards them to the init)."""
    def forward(signum, _frame) -> None:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)


def view_read(opts) -> list[str]:
    """Everything the learner may read (and execute), as absolute real paths."""
    paths = SYSTEM_READ + python_paths() + list(opts.read)
    if opts.redis_dir:
        paths.append(opts.redis_dir)
    if opts.pg_dir:
        paths.append(opts.pg_dir)
    return [os.path.abspath(p) for p in paths]


_PR_SET_MM, _PR_SET_MM_ARG_START, _PR_SET_MM_ARG_END = 35, 8, 9
_SHOWN: list = []               # the argv area the kernel reads, kept alive


def _arg_area() -> tuple[int, int]:
    """Where /proc/self/cmdline is read from (fields 48 and 49 of stat)."""
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(stat[45]), int(stat[46])


def show_argv(argv: list[str]) -> str:
    """/proc/self/cmdline reads `argv`, as after an exec of it: 'exact' (the
    kernel pointed at a new area, which needs CAP_SYS_RESOURCE), 'padded' (the
    old area overwritten, its unused tail NUL bytes), or '' (left as it was)."""
    data = b"".join(a.encode() + b"\0" for a in argv)
    libc, ulong = _libc(), ctypes.c_ulong
    try:
        start, end = _arg_area()
    except (OSError, ValueError, IndexError):
        return ""
    buf = ctypes.create_string_buffer(data, len(data))
    new = ctypes.addressof(buf)

    def point(a: int, b: int) -> bool:     # the order keeps start <= end
        first = [(_PR_SET_MM_ARG_START, a), (_PR_SET_MM_ARG_END, b)]
        for opt, addr in first if a < end else first[::-1]:
            if libc.prctl(_PR_SET_MM, ulong(opt), ulong(addr), ulong(0),
                          ulong(0)) != 0:
                return False
        return True

    if point(new, new + len(data)):
        _SHOWN.append(buf)
        return "exact"
    if _arg_area() != (start, end) and not point(start, end):
        raise OSError("the command line could not be put back")
    if len(data) > end - start:
        return ""
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)
    return "padded"


def _drop_capabilities() -> None:
    libc = _libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break


def become_learner(opts, cmd: list[str], mode: str, report_fd: int) -> None:
    """The last trusted steps in the learner's process; then exec, or run the
    script here with --no-exec (never returns)."""
    try:
        if not opts.keep_group:
            os.setsid()
        if opts.uid:                    # its own user: no capability is left
            _drop_capabilities()
            os.setgroups([])
            os.setresgid(opts.uid, opts.uid, opts.uid)
            os.setresuid(opts.uid, opts.uid, opts.uid)
        os.chdir(opts.workdir)
        tmp = os.path.join(opts.workdir, "tmp")
        os.makedirs(tmp, exist_ok=True)
        disk = opts.disk_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if not opts.cgroup:
            mem = opts.mem_mb * 1024 * 1024
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            if os.geteuid() != 0:
                with contextlib.suppress(ValueError, OSError):
                    resource.setrlimit(resource.RLIMIT_NPROC, (opts.pids, opts.pids))
        if mode == "root":
            _drop_capabilities()
        read = view_read(opts)
        abi = landlock.restrict(
            read=read + (["/proc"] if mode else []),
            write=[opts.workdir] + (["/dev/shm"] if mode else []), devices=DEVICES,
            listable=[os.path.dirname(p) for p in read if not os.path.isdir(p)],
            deny_tcp=not mode)
        os.write(report_fd, (json.dumps({"landlock": abi}) + "\n").encode())
        os.close(report_fd)
        env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                        "/usr/local/bin", "/usr/bin", "/bin"]),
               "HOME": opts.workdir, "TMPDIR": tmp,
               "LANG": os.environ.get("LANG", "C.UTF-8")}
        if opts.redis_url:
            env["REDIS_URL"] = opts.redis_url
        if opts.pg_url:             # the learner's role, for any client's habit
            env["DATABASE_URL"] = env["PGQ_URL"] = opts.pg_url
        env.update(kv.split("=", 1) for kv in opts.env)
        env.update((k, os.environ[k]) for k in opts.passenv if k in os.environ)
        if opts.no_exec and _this_python(cmd):
            # the script is the course's plumbing: seen as `python ARGS`
            show_argv([cmd[0], *cmd[2:]])
            _drop_effective_capabilities(mode)
            run_script = _warm_runner()
        else:
            os.execvpe(cmd[0], cmd, env)
    except BaseException as err:          # noqa: BLE001 - report, never run unconfined
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: could not start {cmd[:1]}: {err}\n".encode())
        os._exit(126)
    run_script(cmd[1:], env)                # the learner's code: never returns


def _this_python(cmd: list[str]) -> bool:
    """`cmd` is this interpreter running a script file (not -m, -c or a flag)."""
    return (len(cmd) >= 2 and not cmd[1].startswith("-")
            and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable))


def _warm_runner():
    from handson.infra import warm_start  # preloaded where --no-exec is used
    return warm_start.run_script


def _drop_effective_capabilities(mode: str) -> None:
    """What exec does for root once the bounding set is empty: no capability
    left, permitted, effective or inheritable (a fork keeps them all)."""
    if mode != "root":
        return                  # a user namespace's root keeps them, as on exec
    libc = _libc()
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
           "clear ambient capabilities")


def _hand_over(workdir: str, uid: int) -> None:
    """The work dir and what the caller put in it become the identity's."""
    for top, dirs, files in os.walk(workdir):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            os.chown(name, uid, uid, follow_symlinks=False)


def summarize(protections: dict) -> str:
    """One line: full, partial (what is missing) or none."""
    missing = []
    abi = protections.get("landlock", 0)
    if not abi:
        missing.append("no Landlock")
    elif abi < 6:
        missing.append(f"Landlock ABI {abi} (no signal scope)")
    if not protections.get("namespaces"):
        missing.append("no namespaces")
    if not protections.get("cgroup"):
        missing.append("no cgroup")
    if not missing:
        return "full"
    if len(missing) == 3 and not abi:
        return "none"
    return "partial: " + ", ".join(missing)


def _view_root() -> tuple[str, bool]:
    """The folder a run's view is mounted on, and whether it was made for this run.

    One empty folder of the caller's serves every run, as each mounts its view in
    a mount namespace of its own: a launcher killed before it could tidy up
    leaves nothing behind (a folder of its own a run, such launchers left 260 in
    one run of the suite).
    """
    path = os.path.join(_temp_dir(), f"eo-view-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            return path, False
    return tempfile.mkdtemp(prefix="eo-root-", dir=_temp_dir()), True


def _temp_dir() -> str:
    """The folder tempfile would pick, without its first-call probe: that writes
    a file of a random name there and deletes it, and a launcher killed between
    the two leaves the file behind."""
    return next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP")
                 if os.environ.get(v)), "/tmp")


def launch(opts, cmd: list[str]) -> int:
    """The launcher: cgroup, namespaces, fork the init, wait, report."""
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    opts.workdir = os.path.realpath(opts.workdir)
    exe = os.path.abspath(cmd[0]) if os.sep in cmd[0] else shutil.which(cmd[0])
    cmd = [exe or cmd[0], *cmd[1:]]
    opts.redis_dir = redis_dir(opts.redis_url)
    opts.pg_dir = pg_dir(opts.pg_url)
    opts.uid = 0
    if opts.identity and os.geteuid() == 0:
        opts.uid = identity_uid(opts.workdir)
        _hand_over(opts.workdir, opts.uid)
    cgroup = Cgroup(run_id(opts.workdir))
    opts.cgroup = os.geteuid() == 0 and cgroup.setup(opts.mem_mb, opts.pids,
                                                     opts.cpus)
    opts.root, own_root = _view_root()
    if opts.init and os.getpid() == 1 and not (own_root or opts.status or opts.uid):
        return _as_init(opts, cmd)
    mode = _unshare(own_identity=bool(opts.identity))
    if opts.uid and mode != "root":
        opts.uid = 0                    # no namespaces: not worth a setuid alone
    read_end, write_end = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = 125
        try:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() == (0 if mode else me):     # 0: parent outside the ns
                code = init(opts, cmd, mode, write_end)
        except BaseException as err:      # noqa: BLE001
            with contextlib.suppress(OSError):
                os.write(2, f"sandbox: setup failed: {err!r}\n".encode())
        os._exit(code)
    os.close(write_end)
    _forward_stops(pid)
    report: dict = {}
    with os.fdopen(read_end, "rb") as fh:
        for line in fh:                   # until the init exits
            with contextlib.suppress(ValueError):
                report.update(json.loads(line.decode(errors="replace")))
            if report.pop("view_ready", False) and own_root:
                with contextlib.suppress(OSError):
                    os.rmdir(opts.root)   # not a mount point here, nor in the ns
                own_root = False
    _, status = os.waitpid(pid, 0)
    protections = {"landlock": report.pop("landlock", 0), "namespaces": mode,
                   "cgroup": bool(opts.cgroup), "env": "scrubbed",
                   "cpu_cap": opts.cpus if cgroup.cpu_capped else 0,
                   "disk_quota_mb": opts.disk_mb}
    if opts.identity:
        protections["identity"] = (f"uid {opts.uid} of its own" if opts.uid else
                                   "the caller's uid in a user namespace"
                                   if mode == "user" else "the caller's")
    report.update(returncode=_code(status), protections=protections,
                  isolation=summarize(protections),
                  oom_kills=cgroup.oom_kills() if opts.cgroup else 0,
                  mem_peak_mb=cgroup.peak_mb() if opts.cgroup else 0)
    used = cgroup.cpu_ns() if opts.cgroup else None
    if used:                # the whole run's, this process's and its siblings'
        report.update(cpu_s=round(used[0] / 1e9, 3),
                      cpu_throttled_s=round(used[1] / 1e9, 3))
    if opts.cgroup:
        account(opts.account, cgroup.leave())
    if own_root:
        with contextlib.suppress(OSError):
            os.rmdir(opts.root)
    if opts.status:
        Path(opts.status).write_text(json.dumps(report))
    return report["returncode"]


def _as_init(opts, cmd: list[str]) -> int:
    """--init in a PID namespace our caller made, whose PID 1 we are: be its
    init, with no launcher outside to wait and report (nobody reads a report:
    there is no status file). The run's cgroup is left to the last launcher or
    to `sandbox.cleanup`."""
    _check(_libc().unshare(CLONE_NEWNET | CLONE_NEWIPC),
           "unshare network and IPC namespaces")
    with open(os.devnull, "wb") as nowhere:
        return init(opts, cmd, "root", nowhere.fileno())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Confine a learner command, then run it.")
    p.add_argument("--workdir", required=True)
    p.add_argument("--read", action="append", default=[])
    p.add_argument("--redis-url")
    p.add_argument("--pg-url", help="a PostgreSQL URL on a Unix socket: its "
                   "directory is in the view, the URL in DATABASE_URL and PGQ_URL")
    p.add_argument("--mem-mb", type=int, default=2048)
    p.add_argument("--cpus", type=float, default=0.0,
                   help="cap the run's processes to this many CPUs (0: no cap)")
    p.add_argument("--pids", type=int, default=512)
    p.add_argument("--disk-mb", type=int, default=512)
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--pass", action="append", default=[], dest="passenv",
                   help="copy this variable from the launcher's environment")
    p.add_argument("--keep-group", action="store_true",
                   help="stay in the caller's process group, so that stopping or "
                   "killing the caller's group stops or kills the learner too")
    p.add_argument("--identity", metavar="NAME",
                   help="run CMD as a user of its own named NAME (a server that "
                   "refuses root): as root a uid no other run has, owning the "
                   "work dir; else the caller's uid in its user namespace")
    p.add_argument("--status")
    p.add_argument("--account", default="learner", metavar="ROLE",
                   help="whose CPU the cgroup's is in the cost log (COST_LOG)")
    p.add_argument("--no-exec", action="store_true",
                   help="the launcher is a fork of a warm-start server: run a "
                   "Python script CMD in the confined process, not a fresh "
                   "interpreter (the same steps, then what exec would reset)")
    p.add_argument("--init", action="store_true",
                   help="if this process is PID 1 of a PID namespace its caller "
                   "made (a warm-start server's fork as root), be its init: no "
                   "launcher process (needs no --status, --identity)")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    cmd = opts.cmd[1:] if opts.cmd[:1] == ["--"] else opts.cmd
    if not cmd or not os.path.isdir(opts.workdir):
        print("confine: need an existing --workdir and a command after --",
              file=sys.stderr)
        return 2
    return launch(opts, cmd)


if __name__ == "__main__":
    sys.exit(main())
