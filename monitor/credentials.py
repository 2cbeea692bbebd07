"""Temporarily act with a target's file-system credentials on the current thread.

Permission checks must be the target's, never root's: fhmon opens with the target's fsuid,
fsgid, supplementary groups and effective capabilities, using per-thread raw syscalls
(glibc's wrappers would change every thread). Everything here is synchronous: no await may
happen while a switch is in force.
"""

from __future__ import annotations

import os

from monitor import linux
from monitor.proc_status import Credentials
from protocol import kernel

# Capabilities that opening a given directory or regular file never consults: holding them
# while reopening one for a capability-less target changes no permission check. (A path
# walk may consult CAP_SYS_PTRACE: /proc/PID of another user under hidepid.)
_OPEN_NEUTRAL_CAPS = (1 << kernel.CAP_KILL | 1 << kernel.CAP_SETGID | 1 << kernel.CAP_SETUID
                      | 1 << kernel.CAP_SYS_PTRACE)


class _Baseline:
    def __init__(self) -> None:
        self.effective, self.permitted, self.inheritable = linux.capget_thread()
        self.fsuid = os.geteuid()
        self.fsgid = os.getegid()
        self.groups = tuple(os.getgroups())
        self.fsuid_drops_caps = self._fsuid_drops_caps()

    def _fsuid_drops_caps(self) -> bool:
        """Whether setfsuid alone acts for a capability-less target here.

        The kernel clears the file-system capabilities from the effective set when the
        fsuid leaves 0 and raises them again from the permitted set when it returns. If
        what is left in between opens nothing (fhmon's hardened set: CAP_DAC_READ_SEARCH is
        the only file-system one), the two capset calls around a reopen can go.
        Measured on this thread's own credentials, not assumed.
        """
        if self.fsuid != 0 or self.effective != self.permitted:
            return False
        linux.setfsuid(_PROBE_UID)
        try:
            during = linux.capget_thread()[0]
        finally:
            linux.setfsuid(0)
        after = linux.capget_thread()[0]
        return during & ~_OPEN_NEUTRAL_CAPS == 0 and after == self.effective


_PROBE_UID = 65534


_baseline: _Baseline | None = None


def _base() -> _Baseline:
    global _baseline
    if _baseline is None:
        _baseline = _Baseline()
    return _baseline


class acting_as:
    """Switch to creds for the duration of the block; always switch back.

    reopen_only: the block only reopens an object fhmon holds (through /proc/self/fd), no
    path walk of the target's; the cheaper switch may then do.
    A class rather than a generator-based context manager: it runs on every call.
    """

    __slots__ = ("_creds", "_reopen_only")

    def __init__(self, creds: Credentials, *, reopen_only: bool = False) -> None:
        self._creds = creds
        self._reopen_only = reopen_only

    def __enter__(self) -> None:
        base = _base()
        creds = self._creds
        try:
            if creds.groups != base.groups:
                linux.setgroups_thread(creds.groups)
            linux.setfsgid(creds.fsgid)
            linux.setfsuid(creds.fsuid)  # drops the file-system caps if it leaves 0
            if not self._fsuid_only(base):
                linux.capset_thread(creds.cap_effective & base.permitted, base.permitted,
                                    base.inheritable)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _fsuid_only(self, base: _Baseline) -> bool:
        """Whether the fsuid change alone leaves the right capabilities (no capset)."""
        creds = self._creds
        return (self._reopen_only and base.fsuid_drops_caps and creds.cap_effective == 0
                and creds.fsuid != 0)

    def __exit__(self, *exc: object) -> None:
        base = _base()
        fsuid_only = self._fsuid_only(base)
        if not fsuid_only:
            linux.capset_thread(base.permitted, base.permitted, base.inheritable)
        linux.setfsuid(base.fsuid)  # back to 0: the kernel raises the fs caps again
        linux.setfsgid(base.fsgid)
        if self._creds.groups != base.groups:
            linux.setgroups_thread(base.groups)
        if not fsuid_only and base.effective != base.permitted:
            linux.capset_thread(base.effective, base.permitted, base.inheritable)
