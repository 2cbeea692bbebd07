"""`--sandbox`: fhmon's own seccomp allow-list, installed once start-up is done.

If fhmon itself were compromised (say through a parser bug), the filter takes away what
an attacker would want most: execve, ptrace, mount, module loading, bpf, namespaces, and
the rest of the ~450 syscalls fhmon never makes. Anything not listed fails with EPERM
(not a kill: a stray syscall in some library path must not take the service down).
The list was taken from strace of the full test suite, plus what Python's runtime may call.
"""

from __future__ import annotations

import errno

import pyseccomp

ALLOWED = (
    # the emulation itself
    "ioctl", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "name_to_handle_at", "open_by_handle_at", "openat2", "openat",
    "statx", "newfstatat", "fstat", "lstat", "stat", "readlink", "readlinkat", "kcmp",
    "setfsuid", "setfsgid", "setgroups", "capget", "capset", "fcntl", "close", "close_range",
    "read", "pread64", "write", "pwrite64", "readv", "writev", "lseek", "getdents64", "dup",
    "dup2", "dup3", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "kill",
    "tgkill", "tkill",
    # worker processes (`workers = N`): started before the filter, reaped under it
    "wait4", "waitid",
    # the intake socket, the keeper, metrics over TCP
    "socket", "socketpair", "bind", "listen", "accept", "accept4", "connect", "recvmsg",
    "sendmsg", "recvfrom", "sendto", "getsockopt", "setsockopt", "getsockname",
    "getpeername", "shutdown",
    # trio's event loop, signals, threads
    "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "poll",
    "ppoll", "select", "pselect6", "eventfd2", "pipe", "pipe2", "rt_sigaction",
    "rt_sigprocmask", "rt_sigreturn", "rt_sigtimedwait", "sigaltstack", "futex",
    "futex_waitv", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres",
    "gettimeofday", "sched_yield", "sched_getaffinity", "clone", "clone3", "set_robust_list",
    "get_robust_list", "rseq", "set_tid_address", "gettid", "getpid", "getppid", "exit",
    "exit_group", "restart_syscall",
    # memory and process bookkeeping
    "mmap", "munmap", "mprotect", "mremap", "madvise", "brk", "getrandom", "prlimit64",
    "mlock", "munlock",  # the native plane's key pages
    "getrlimit", "getrusage", "times", "sysinfo", "uname", "prctl", "arch_prctl", "umask",
    "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid", "getresgid",
    "getcwd",
    # the key directory and the socket file
    "unlink", "unlinkat", "rename", "renameat", "renameat2", "mkdir", "mkdirat", "chmod",
    "fchmod", "fchmodat", "chown", "fchown", "fchownat", "fsync", "fdatasync", "ftruncate",
)


def install(allowed: tuple[str, ...] = ALLOWED) -> int:
    """Install the allow-list on every thread of this process; returns how many rules."""
    flt = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
    flt.set_attr(pyseccomp.Attr.CTL_TSYNC, 1)
    count = 0
    for name in allowed:
        try:
            flt.add_rule(pyseccomp.ALLOW, name)
            count += 1
        except (OSError, ValueError):
            continue  # a syscall this libseccomp does not know
    flt.load()  # sets no_new_privs first: fhmon has no CAP_SYS_ADMIN any more
    return count
