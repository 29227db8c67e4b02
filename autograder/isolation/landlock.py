"""Landlock through ctypes: a process restricts itself, then execs learner code.

Landlock (Linux 5.13+) needs no privilege: a process lists what it may still
touch, and from then on the kernel refuses everything else, for it and for every
process it starts. What each ABI version adds:

- 1: files (read, write, execute, make, remove); 2: rename across dirs;
  3: truncate; 5: ioctl on devices;
- 4: TCP bind and connect (we allow neither);
- 6: scopes: no signal to a process outside the sandbox, no connect to an
  abstract Unix socket created outside it.

`restrict(read=..., write=...)` applies what the running kernel supports and
returns that ABI version (0: no Landlock at all, nothing applied).
"""

from __future__ import annotations

import ctypes
import os

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_CREATE_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1,
              5: (1 << 16) - 1}
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = READ_FILE | READ_DIR | EXECUTE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64),
                ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI version, 0 when there is none (or not Linux)."""
    numbers = _SYSCALLS.get(os.uname().machine)     # not `platform`: a slow import
    if os.uname().sysname != "Linux" or numbers is None:
        return 0
    version = _libc().syscall(numbers[0], None, ctypes.c_size_t(0),
                              ctypes.c_uint32(_CREATE_VERSION))
    return max(int(version), 0)


def _fs_access(abi: int) -> int:
    return _FS_BY_ABI[max(v for v in _FS_BY_ABI if v <= abi)]


def restrict(read: list[str], write: list[str], devices: list[str] = (),
             listable: list[str] = (), deny_tcp: bool = True) -> int:
    """Allow reading/executing `read`, everything under `write`, rw on `devices`,
    listing (names only, not contents) the directories `listable`.
    `deny_tcp=False` leaves TCP to the caller (a private network namespace).

    Everything else on the file system, every TCP bind/connect (ABI 4+), every
    signal to and abstract socket of a process outside (ABI 6+) is denied from
    now on. Paths that do not exist are skipped. Returns the ABI applied.
    """
    abi = abi_version()
    if abi == 0:
        return 0
    create, add_rule, restrict_self = _SYSCALLS[os.uname().machine]
    libc = _libc()
    fs = _fs_access(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 and deny_tcp else 0
    attr = _RulesetAttr(fs, net,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        device_access = READ_FILE | WRITE_FILE | (IOCTL_DEV & fs) | (TRUNCATE & fs)
        for paths, access in ((read, READ), (write, fs), (devices, device_access),
                              (listable, READ_DIR)):
            for path in paths:
                _add_path(libc, add_rule, ruleset, path, access)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(restrict_self, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_path(libc, add_rule: int, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            access &= _FILE_ONLY
        rule = _PathBeneath(access, fd)
        if libc.syscall(add_rule, ruleset, ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)
