"""The namespaces of a confined run and the file system view its init builds:
only the Python installation, system libraries, the read paths (read-only),
the run's socket directories and its work dir (writable), /dev and /proc.

Used by the trusted launcher (`confine`) before any learner code runs.
"""

from __future__ import annotations

import _socket
import contextlib
import ctypes
import fcntl
import os
import struct
from pathlib import Path
from stat import S_ISDIR, S_ISREG

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x20000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
SYSTEM_READ = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc"]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(own_identity: bool = False) -> str:
    """New PID/net/IPC namespaces: 'root', 'user' (via a user ns) or ''.

    The mount namespace comes later, in the init, so that the launcher keeps
    the real file system (it writes the status file after the init is gone).
    In a user namespace the caller is root inside, or itself with
    `own_identity` (a server that refuses root).
    """
    libc = _libc()
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    if os.geteuid() == 0 and libc.unshare(flags) == 0:
        return "root"
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(flags | CLONE_NEWUSER) != 0:
        return ""
    with contextlib.suppress(OSError):
        Path("/proc/self/setgroups").write_text("deny")
    inside_uid, inside_gid = (uid, gid) if own_identity else (0, 0)
    try:
        Path("/proc/self/uid_map").write_text(f"{inside_uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{inside_gid} {gid} 1")
    except OSError:
        return ""
    return "user"


def _mount(src, target, fstype, flags: int, data: str | None = None) -> None:
    libc = _libc()
    _check(libc.mount(src and src.encode(), target.encode(),
                      fstype and fstype.encode(), ctypes.c_ulong(flags),
                      data and data.encode()), f"mount {target}")


def _bind(src: str, root: str, writable: bool) -> None:
    target = root + src
    if os.path.exists(target) and not os.path.islink(target):
        pass
    elif os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
    _mount(src, target, None, MS_BIND | MS_REC)
    if not writable:
        locked = 0
        with contextlib.suppress(OSError):
            f = os.statvfs(target).f_flag
            locked = (f & os.ST_NOEXEC and MS_NOEXEC) | (f & os.ST_NODEV and MS_NODEV)
        _mount(None, target, None,
               MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | locked)


def build_view(root: str, read: list[str], write: list[str],
               identity: tuple[str, int] | None = None) -> None:
    """Make `root` the new / holding only `read` (ro), `write` (rw), /dev, /proc;
    with `identity` (name, uid), /etc/passwd and /etc/group know that user."""
    _check(_libc().unshare(CLONE_NEWNS), "unshare mount namespace")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=0755")
    wanted = [(p, False) for p in read] + [(p, True) for p in write]
    for path, writable in sorted(wanted, key=lambda pw: len(pw[0])):
        if os.path.islink(path) and os.path.dirname(path) == "/":
            os.symlink(os.readlink(path), root + path)     # /lib -> usr/lib
        elif os.path.exists(path):
            _bind(path, root, writable)
    for dev in DEVICES:
        if os.path.exists(dev):
            _bind(dev, root, True)
    if os.path.isdir(root + "/etc"):
        _mask_private(root, "/etc")
        if identity:
            _name_identity(root, *identity)
    os.makedirs(root + "/dev/shm", exist_ok=True)
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           "size=64m,mode=1777")
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    libc = _libc()
    _check(libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mask_private(root: str, top: str, depth: int = 3) -> None:
    """Cover what only its owner may read (/etc/shadow, a private key's folder)
    with something empty: learner code runs as root without capabilities, and
    owner rights would still open a root-owned 0640 file."""
    empty_file, empty_dir = f"{root}/.empty", f"{root}/.empty.d"
    for path, is_dir in _private(top, depth):
        source = empty_dir if is_dir else empty_file
        if not os.path.exists(source):
            os.mkdir(source, 0o555) if is_dir else Path(source).touch()
        _mount(source, root + path, None, MS_BIND)
        _mount(None, root + path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _private(top: str, depth: int) -> list[tuple[str, bool]]:
    """(path, is a folder) of each file or folder under `top` that others may
    not read, `depth` levels down. Each host walks it anew (a file made
    owner-only after its server started is covered too); the directory's own
    entry type tells a symbolic link (most of /etc) without a stat of it."""
    found, stack = [], [(top, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            it = os.scandir(folder)
        except OSError:
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_symlink():
                        continue
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if S_ISDIR(mode):
                    if not mode & 0o001:
                        found.append((entry.path, True))
                    elif level + 1 < depth:
                        stack.append((entry.path, level + 1))
                elif S_ISREG(mode) and not mode & 0o004:
                    found.append((entry.path, False))
    return found


def _name_identity(root: str, name: str, uid: int) -> None:
    """The host's passwd and group, less any `name` or `uid` entry, plus ours,
    bound read-only over the view's (tools look their user up by uid)."""
    line = {"passwd": f"{name}:x:{uid}:{uid}:{name}:/nonexistent:/usr/sbin/nologin",
            "group": f"{name}:x:{uid}:"}
    for db, own in line.items():
        kept = []
        with contextlib.suppress(OSError):
            for entry in Path(f"/etc/{db}").read_text().splitlines():
                fields = entry.split(":")
                if fields[0] != name and fields[2:3] != [str(uid)]:
                    kept.append(entry)
        made = f"{root}/.{db}"
        Path(made).write_text("\n".join([*kept, own]) + "\n")
        target = f"{root}/etc/{db}"
        if os.path.exists(target):
            _mount(made, target, None, MS_BIND)
            _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def loopback_up() -> None:
    """Bring up `lo` of the private network namespace: TCP inside, none out."""
    ifreq = struct.pack("16sH14x", b"lo", 0)
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | 1))
    finally:
        s.close()
