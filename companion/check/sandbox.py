"""The box a checker worker runs in: limits, a write-only-here file system, and a clean end.

``python -m companion.check.sandbox SPEC.json`` is started by the runner. It makes itself a
child subreaper (``PR_SET_CHILD_SUBREAPER``: every process the worker starts, even one that
called ``setsid()`` and double-forked, stays its descendant), forks, and in the child:

* starts a new session;
* sets ``RLIMIT_DATA`` (memory: heap and private writable mappings), ``RLIMIT_CPU`` (CPU
  seconds) and ``RLIMIT_NPROC`` (processes of this user; the kernel does not apply it to root,
  so the launcher also counts the worker's descendants and stops the whole tree past the limit);
* with Landlock (Linux 5.13+, unprivileged), allows writing, creating, renaming and deleting
  files only under the homework folder, the scratch folder and ``/dev/null`` (reads stay free),
  and from Landlock ABI 6 forbids signalling processes outside the box (the launcher, the runner);
* executes the worker.

When the worker ends, or the runner sends SIGTERM, every descendant still alive is killed (found
by scanning ``/proc``) and the launcher writes one JSON line to its status fd: the worker's exit
status, the limit it hit (if any), how many leftover processes were killed, and whether
Landlock was applied.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time

LINUX = sys.platform.startswith("linux")
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
_SYS_CREATE, _SYS_ADD_RULE, _SYS_RESTRICT = 444, 445, 446  # the same on x86-64 and arm64
_WRITE_RIGHTS = [  # LANDLOCK_ACCESS_FS_* bits that change the file system, by ABI
    (
        1,
        (1 << 1)
        | (1 << 4)
        | (1 << 5)
        | (1 << 6)
        | (1 << 7)
        | (1 << 8)
        | (1 << 9)
        | (1 << 10)
        | (1 << 11)
        | (1 << 12),
    ),  # WRITE_FILE, REMOVE_*, MAKE_*
    (2, 1 << 13),  # REFER
    (3, 1 << 14),  # TRUNCATE
]
_FILE_RIGHTS = (1 << 1) | (1 << 14)  # what a rule on a single file (/dev/null) may grant
_SCOPE_SIGNAL = 1 << 1  # LANDLOCK_SCOPE_SIGNAL (ABI 6)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none."""
    if not LINUX:
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    return max(0, libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def landlock_writable_only(paths: list[str]) -> str:
    """Allow changes to the file system only beneath ``paths`` (and /dev/null), for this process
    and everything it starts. Returns what was applied, or why nothing was (no Landlock)."""
    if not LINUX:
        return "not applied: Landlock is Linux's; writes outside the folder are allowed"
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 0:
        return "not applied: this kernel has no Landlock, writes outside the folder are allowed"
    handled = 0
    for since, bits in _WRITE_RIGHTS:
        if abi >= since:
            handled |= bits
    attr = _RulesetAttr(handled, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16
    ruleset = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return f"not applied: landlock_create_ruleset failed (errno {ctypes.get_errno()})"
    try:
        for path in paths + ["/dev/null"]:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = handled if os.path.isdir(path) else handled & _FILE_RIGHTS
                rule = _PathBeneath(allowed, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) < 0:
                    return f"not applied: cannot add {path} (errno {ctypes.get_errno()})"
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return "not applied: prctl(PR_SET_NO_NEW_PRIVS) failed"
        if libc.syscall(_SYS_RESTRICT, ruleset, 0) < 0:
            return f"not applied: landlock_restrict_self failed (errno {ctypes.get_errno()})"
    finally:
        os.close(ruleset)
    scope = ", signals to processes outside it refused" if abi >= 6 else ""
    return f"applied (Landlock ABI {abi}{scope})"


def _set_limits(limits: dict) -> None:
    memory, cpu, procs = limits["memory"], limits["cpu"], limits["processes"]
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))  # Linux 4.7+: mmap counts too
    cpu = int(max(1, cpu))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
    if os.getuid() != 0:  # per user, threads included: on top of what the user runs now
        tasks = _user_tasks()
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks + procs, tasks + procs))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _user_tasks() -> int:
    """Tasks (processes and threads) of this user now, which RLIMIT_NPROC counts."""
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def _children(pid: int) -> list[int] | None:
    """Children of ``pid`` from /proc/PID/task/*/children (None when the kernel lacks it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            return None if tid == tasks[0] and not found else found
        except OSError:
            continue
    return found


def descendants(pid: int | None = None) -> list[int]:
    """Live descendants of ``pid`` (default: this process), from /proc: each process's
    ``children`` file where the kernel has it (cheap: only this tree is read), else a scan."""
    root = pid or os.getpid()
    children_of: dict[int, list[int]] | None = None
    found, todo = [], [root]
    while todo:
        current = todo.pop()
        kids = _children(current) if children_of is None else None
        if kids is None:
            children_of = children_of or _children_map()
            kids = children_of.get(current, [])
        found += kids
        todo += kids
    return found


def _reap() -> list[tuple[int, int, object]]:
    done = []
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status, usage))


def kill_tree(reaped: list) -> int:
    """SIGKILL every descendant until none is left (a fork bomb converges: the killed cannot
    fork); returns how many were killed. What is reaped meanwhile is added to ``reaped``."""
    killed: set[int] = set()
    for _ in range(1000):
        alive = descendants()
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        reaped += _reap()
        time.sleep(0.005)
    return len(killed)


def _child(spec: dict) -> None:
    """In the forked child: session, limits, Landlock, then exec the worker."""
    os.setsid()
    _set_limits(spec["limits"])
    landlock = landlock_writable_only(spec["writable"])
    env = dict(spec["env"], COMPANION_CHECK_LANDLOCK=landlock)
    os.set_inheritable(spec["worker_fd"], True)
    os.execve(spec["argv"][0], spec["argv"], env)


def run(spec: dict, status_fd: int) -> None:
    """Start the worker in its box, watch it, clean up after it, and report on ``status_fd``."""
    if LINUX:  # elsewhere: no subreaper, the worker's session is killed, not its escapees
        libc = _libc()
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    worker = os.fork()
    if worker == 0:
        try:
            os.close(status_fd)
            _child(spec)
        finally:
            os._exit(127)
    os.close(spec["worker_fd"])
    os.write(status_fd, (json.dumps({"worker": worker}) + "\n").encode())  # for a fallback kill
    status, usage, limit = None, None, None
    while status is None and not stop["asked"]:
        for pid, st, ru in _reap():
            if pid == worker:
                status, usage = st, ru
        if status is None and len(descendants()) > spec["limits"]["processes"]:
            limit = "processes"
            break
        time.sleep(0.05)
    try:
        os.killpg(worker, signal.SIGKILL)  # its session (the worker made it its group too)
    except (ProcessLookupError, PermissionError):
        pass
    reaped: list = []
    leftover = kill_tree(reaped)
    if status is None:
        for pid, st, ru in reaped + _reap():
            if pid == worker:
                status, usage = st, ru
    code = None if status is None else os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    if limit is None and code is not None and code < 0 and cpu >= spec["limits"]["cpu"] - 0.5:
        limit = "cpu"
    report = {"returncode": code, "limit": limit, "leftover": leftover, "cpu": cpu}
    os.write(status_fd, (json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        _spec = json.load(f)
    run(_spec, int(sys.argv[2]))
    os._exit(0)
