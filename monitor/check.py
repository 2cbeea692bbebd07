"""`fhmon check`: can this host and this process run fhmon? Each check names what is missing."""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import stat
from collections.abc import Callable
from dataclasses import dataclass

from monitor import linux, seccomp_filter, signing
from protocol import kernel

CAPS = {"CAP_DAC_READ_SEARCH": (2, "open_by_handle_at"),
        "CAP_KILL": (5, "SIGSTOP/SIGCONT a target so calls a previous fhmon held trap again"),
        "CAP_SETGID": (6, "switch fsgid/groups to the target's for permission checks"),
        "CAP_SETUID": (7, "switch fsuid to the target's for permission checks"),
        "CAP_SYS_PTRACE": (19, "pidfd_getfd and process_vm_readv/writev on targets")}


@dataclass
class Result:
    name: str
    ok: bool
    detail: str
    required: bool = True


def _kernel_version() -> tuple[int, int]:
    parts = platform.release().split(".")
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)


def check_user_notif() -> Result:
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as handle:
            actions = handle.read().split()
    except OSError as exc:
        return Result("seccomp user notification", False, f"no seccomp in this kernel: {exc}")
    ok = "user_notif" in actions
    return Result("seccomp user notification", ok,
                  "available" if ok else "kernel lacks SECCOMP_RET_USER_NOTIF (needs 5.0+)")


def check_addfd_send() -> Result:
    ok = _kernel_version() >= (5, 14)
    return Result("SECCOMP_ADDFD_FLAG_SEND", ok, f"kernel {platform.release()}"
                  + ("" if ok else ": needs 5.14+ to inject fds atomically"))


def _listener_probe() -> tuple[bool, str]:
    """Install the real filter in a child and try SET_FLAGS(SYNC_WAKE_UP) on its listener."""
    try:
        pid, fd, channel = seccomp_filter.fork_under_filter()
    except (OSError, seccomp_filter.FilterSetupError) as exc:
        return False, f"could not install a filter with NEW_LISTENER: {exc}"
    try:
        fcntl.ioctl(fd, kernel.SECCOMP_IOCTL_NOTIF_SET_FLAGS,
                    kernel.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
        return True, "available"
    except OSError as exc:
        return False, f"SET_FLAGS: {os.strerror(exc.errno or errno.EINVAL)} (needs 6.6+)"
    finally:
        os.close(fd)
        channel.close()  # the child ends
        os.waitpid(pid, 0)


def check_sync_wakeup() -> Result:
    ok, detail = _listener_probe()
    return Result("SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP", ok, detail, required=False)


def check_pidfd_thread() -> Result:
    try:
        fd = linux.pidfd_open(os.getpid(), kernel.PIDFD_THREAD)
        os.close(fd)
        return Result("PIDFD_THREAD", True, "available", required=False)
    except OSError as exc:
        return Result("PIDFD_THREAD", False, f"{os.strerror(exc.errno or 0)}: thread ids are "
                      f"mapped to their thread group instead (6.9+ has it)", required=False)


def check_capabilities() -> list[Result]:
    effective, _, _ = linux.capget_thread()
    return [Result(name, bool(effective & (1 << bit)), reason)
            for name, (bit, reason) in CAPS.items()]


def check_key_dir(key_dir: str) -> Result:
    try:
        ring = signing.KeyRing.load(key_dir)
    except signing.KeyDirError as exc:
        return Result("key directory", False, str(exc))
    return Result("key directory", True, f"{len(ring.key_ids)} key(s), signer "
                  f"{ring.signer:08x}")


def socket_dir_problem(directory: str) -> str | None:
    """Why someone but root could replace the socket in `directory`, or None if no one can.

    The rule (docs/operations.md, "The socket directory"): the socket's own directory must
    be owned by root and writable by no one else, neither group nor others, sticky or not
    (a sticky directory still lets anyone create the name while fhmon is down). Every
    ancestor, as the path resolves, must be owned by root and not writable by group or
    others unless sticky (there no one else can rename root's directory away).
    """
    try:
        real = os.path.realpath(directory, strict=True)
    except OSError as exc:
        return f"socket directory {directory}: {exc.strerror}"
    path, own = real, True
    while True:
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"socket directory {directory}: {path}: {exc.strerror}"
        mode = stat.S_IMODE(st.st_mode)
        which = f"socket directory {real}" if own else f"{path} (above socket directory {real})"
        if not stat.S_ISDIR(st.st_mode):
            return f"{which} is not a directory"
        if st.st_uid not in (0, os.geteuid()):
            return (f"{which} is owned by uid {st.st_uid}, not root: that user could replace "
                    f"the socket")
        writers = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002))
                               if mode & bit)
        if writers and (own or not mode & stat.S_ISVTX):
            return (f"{which} is writable by {writers} (mode {mode:o}): they could replace "
                    f"the socket with their own; make it writable by root only (chmod "
                    f"go-w {path})")
        if path == "/":
            return None
        path, own = os.path.dirname(path), False


def check_socket_dir(socket_path: str) -> Result:
    directory = os.path.dirname(socket_path) or "."
    if not os.path.lexists(directory):
        return Result("socket directory", True, f"{directory} will be created")
    problem = socket_dir_problem(directory)
    if problem is not None:
        return Result("socket directory", False, problem)
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    return Result("socket directory", True, f"{directory} mode {mode:o}, only root can "
                  f"replace the socket")


def check_allow(allow: list[str], key_dir: str | None) -> list[Result]:
    """Allow globs fhmon serve would refuse (FAIL) or that match nothing yet (warn)."""
    from monitor import config

    results = []
    for pattern in allow:
        try:
            config.apply(config.Config(), {"allow": [pattern]}, "--allow")
            config.refuse_protected_glob(pattern, (key_dir or "",))
        except config.ConfigError as exc:
            results.append(Result(f"allow {pattern}", False, str(exc)))
            continue
        if config.unmatched_globs([pattern]):
            results.append(Result(f"allow {pattern}", False, "matches no directory now: no "
                                  "share can be registered under it (a typo?)", required=False))
        else:
            results.append(Result(f"allow {pattern}", True, "matches a directory"))
    return results


def run_checks(key_dir: str | None, socket_path: str | None,
               allow: list[str] | None = None) -> list[Result]:
    steps: list[Callable[[], Result | list[Result]]] = [
        check_user_notif, check_addfd_send, check_sync_wakeup, check_pidfd_thread,
        check_capabilities]
    if key_dir:
        steps.append(lambda: check_key_dir(key_dir))
    if socket_path:
        steps.append(lambda: check_socket_dir(socket_path))
    if allow:
        steps.append(lambda: check_allow(allow, key_dir))
    results: list[Result] = []
    for step in steps:
        out = step()
        results.extend(out if isinstance(out, list) else [out])
    return results
