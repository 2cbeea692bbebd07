"""Temporarily act with a target's file-system credentials on the current thread.

Permission checks must be the target's, never root's: fhmon opens with the target's fsuid,
fsgid, supplementary groups and effective capabilities, using per-thread raw syscalls
(glibc's wrappers would change every thread). Everything here is synchronous: no await may
happen while a switch is in force.
"""

from __future__ import annotations

import os

from monitor import linux
from monitor.target import Credentials


class _Baseline:
    def __init__(self) -> None:
        self.effective, self.permitted, self.inheritable = linux.capget_thread()
        self.fsuid = os.geteuid()
        self.fsgid = os.getegid()
        self.groups = tuple(os.getgroups())


_baseline: _Baseline | None = None


def _base() -> _Baseline:
    global _baseline
    if _baseline is None:
        _baseline = _Baseline()
    return _baseline


class acting_as:
    """Switch to creds for the duration of the block; always switch back.

    A class rather than a generator-based context manager: it runs on every call.
    """

    __slots__ = ("_creds",)

    def __init__(self, creds: Credentials) -> None:
        self._creds = creds

    def __enter__(self) -> None:
        base = _base()
        creds = self._creds
        try:
            if creds.groups != base.groups:
                linux.setgroups_thread(creds.groups)
            linux.setfsgid(creds.fsgid)
            linux.setfsuid(creds.fsuid)
            linux.capset_thread(creds.cap_effective & base.permitted, base.permitted,
                                base.inheritable)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        base = _base()
        linux.capset_thread(base.permitted, base.permitted, base.inheritable)
        linux.setfsuid(base.fsuid)
        linux.setfsgid(base.fsgid)
        if self._creds.groups != base.groups:
            linux.setgroups_thread(base.groups)
        if base.effective != base.permitted:
            linux.capset_thread(base.effective, base.permitted, base.inheritable)
