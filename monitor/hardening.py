"""Self-hardening: after start-up fhmon keeps only the capabilities it uses.

| capability | why |
|---|---|
| CAP_DAC_READ_SEARCH | open_by_handle_at (decode a handle on the share's mount) |
| CAP_SYS_PTRACE | pidfd_getfd, process_vm_readv/writev, /proc/TID/cwd and root of targets |
| CAP_SETUID, CAP_SETGID | switch fsuid, fsgid and groups to a target's for its permission checks |
| CAP_KILL | SIGSTOP/SIGCONT a target whose stuck calls must trap again after a restart |

Everything else (CAP_DAC_OVERRIDE, CAP_SYS_ADMIN, CAP_CHOWN after the socket exists, ...)
is dropped from the effective, permitted, inheritable and bounding sets.
"""

from __future__ import annotations

import ctypes
from typing import Any

from monitor import linux
from protocol import kernel

KEPT = {kernel.CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH",
        kernel.CAP_SYS_PTRACE: "CAP_SYS_PTRACE", kernel.CAP_SETUID: "CAP_SETUID",
        kernel.CAP_SETGID: "CAP_SETGID", kernel.CAP_KILL: "CAP_KILL"}


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except OSError:
        return 40


def drop_capabilities() -> list[str]:
    """Keep only KEPT; returns the names kept. Must run before any other thread starts."""
    libc = ctypes.CDLL(None, use_errno=True)
    _, permitted, _ = linux.capget_thread()
    for cap in range(_last_cap() + 1):
        if cap not in KEPT and permitted & (1 << kernel.CAP_SETPCAP):
            libc.prctl(kernel.PR_CAPBSET_DROP, cap, 0, 0, 0)  # best effort: the bounding set
    keep = sum(1 << cap for cap in KEPT) & permitted
    linux.capset_thread(keep, keep, 0)
    effective, permitted, _ = linux.capget_thread()
    return [name for cap, name in KEPT.items() if effective & (1 << cap)]


def lock_down(*, drop_caps: bool, sandbox: bool) -> dict[str, dict[str, Any]]:
    """The last start-up steps of a process that answers calls (`fhmon serve`, a worker),
    in their order: drop capabilities; open what calls need of the process's own (its
    /proc/self/fd); install the sandbox, which allows no execve (so after any process was
    spawned). Returns the fields of a log event per step taken, by event name."""
    done: dict[str, dict[str, Any]] = {}
    if drop_caps:
        done["capabilities"] = {"kept": drop_capabilities()}
    linux.open_own_fd_dir()
    if sandbox:
        from monitor import sandbox as seccomp_sandbox

        done["sandbox"] = {"rules": seccomp_sandbox.install()}
    return done
