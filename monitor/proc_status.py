"""A thread's credentials as /proc/TID/status gives them (what an open is checked
against), read as untrusted text: the thread may be gone, its TID reused, before the
caller's next ID_VALID."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from monitor.listener import NotificationGone


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the kernel would check an open against: fs ids, groups, effective caps."""

    fsuid: int
    fsgid: int
    groups: tuple[int, ...]
    cap_effective: int


@dataclass(frozen=True, slots=True)
class ThreadStatus:
    tgid: int
    credentials: Credentials
    uid: int  # real uid: who owns the process
    frozen: bool = False  # these credentials can never change for this thread's life
    seccomp_filtered: bool = True  # "Seccomp: 2": the thread runs under a filter


_STATUS_FIELDS = re.compile(
    rb"^(Tgid|Uid|Gid|Groups|CapEff|CapPrm|CapAmb|NoNewPrivs|Seccomp):[ \t]*([^\n]*)$",
    re.MULTILINE)


def _user_ns(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


_OUR_USER_NS = _user_ns("/proc/self/ns/user")


def _in_our_user_ns(tid: int) -> bool:
    theirs = _user_ns(f"/proc/{tid}/ns/user")
    return theirs is not None and theirs == _OUR_USER_NS


def read_status(tid: int) -> ThreadStatus:
    """Parse /proc/TID/status (per-thread credentials; the thread group id)."""
    try:
        fd = os.open(f"/proc/{tid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotificationGone(tid) from None
    try:
        raw = os.read(fd, 65536)
    finally:
        os.close(fd)
    fields = dict(_STATUS_FIELDS.findall(raw))
    try:
        uids = fields[b"Uid"].split()
        gids = fields[b"Gid"].split()
        groups = tuple(int(g) for g in fields[b"Groups"].split())
        # CapEff is relative to the task's own user namespace: a target that made itself
        # "root" in a new user namespace holds no capability over fhmon's files.
        # (with no capability at all, there is nothing to look up)
        caps = int(fields[b"CapEff"], 16)
        if caps and not _in_our_user_ns(tid):
            caps = 0
        creds = Credentials(int(uids[3]), int(gids[3]), groups, caps)
        # No capabilities, one uid and one gid everywhere, no_new_privs: nothing the thread
        # can do (setfsuid to its only uid; no setgroups, no capset gains, no setuid exec)
        # changes what permission checks see.
        frozen = (len(set(uids)) == 1 and len(set(gids)) == 1 and creds.cap_effective == 0
                  and int(fields.get(b"CapPrm", b"1"), 16) == 0
                  and int(fields.get(b"CapAmb", b"1"), 16) == 0
                  and fields.get(b"NoNewPrivs") == b"1")
        return ThreadStatus(int(fields[b"Tgid"]), creds, int(uids[0]), frozen,
                            fields.get(b"Seccomp") == b"2")
    except (KeyError, IndexError, ValueError):
        raise NotificationGone(tid) from None
