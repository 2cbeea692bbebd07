"""The intake socket itself: bound by fhmon, or handed over by systemd (socket activation).

The directory it lives in decides who may replace it (a group member who can write there
could swap in a socket of their own and receive launchers' listeners), so it is checked
before the bind (monitor/check.py socket_dir_problem), and the socket is born with its
final mode and group.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from dataclasses import dataclass

import trio

from monitor import linux, log
from monitor.check import socket_dir_problem
from monitor.config import Config
from monitor.policy import RegistrationRefused

BACKLOG = 128


@dataclass
class IntakeSocket:
    sock: trio.socket.SocketType
    path: str
    activated: bool  # systemd's socket: it stays for the next start
    created_dir: str | None  # the directory fhmon made for it, removed again when empty
    inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket fhmon bound

    def close(self) -> None:
        """Close it; remove what fhmon made (never systemd's socket, nor a successor's: in a
        rolling upgrade the new fhmon may already have replaced the path with its own)."""
        self.sock.close()
        if self.activated:
            return
        with contextlib.suppress(OSError):
            found = os.lstat(self.path)
            if (found.st_dev, found.st_ino) == self.inode:
                os.unlink(self.path)
        if self.created_dir is not None:
            with contextlib.suppress(OSError):  # only if empty
                os.rmdir(self.created_dir)


def open_intake_socket(config: Config) -> IntakeSocket:
    activated = _activated_socket()
    if activated is not None:
        return IntakeSocket(activated, config.socket, activated=True, created_dir=None)
    path = config.socket
    directory = os.path.dirname(path) or "."
    created_dir = None if os.path.isdir(directory) else directory
    os.makedirs(directory, mode=0o755, exist_ok=True)
    problem = socket_dir_problem(directory)
    if problem is not None:
        raise RegistrationRefused(f"{problem}; refusing to serve from it")
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)  # the socket is born 0600; chmod widens it if configured
    # Born with its group, too: a new inode takes the creator's fsgid, so socket_group
    # needs CAP_SETGID (kept anyway), not CAP_CHOWN, which the DaemonSet does not grant.
    old_fsgid = (linux.setfsgid(config.socket_group)
                 if config.socket_group is not None else None)
    try:
        raw.bind(path)
    finally:
        os.umask(old_umask)
        if old_fsgid is not None:
            linux.setfsgid(old_fsgid)
    sock = trio.socket.from_stdlib_socket(raw)
    os.chown(path, config.socket_owner if config.socket_owner is not None else -1,
             config.socket_group if config.socket_group is not None else -1)
    os.chmod(path, config.socket_mode)
    bound = os.lstat(path)
    sock.listen(BACKLOG)
    return IntakeSocket(sock, path, activated=False, created_dir=created_dir,
                        inode=(bound.st_dev, bound.st_ino))


def _activated_socket() -> trio.socket.SocketType | None:
    """A listening socket handed over by systemd (LISTEN_FDS=1, fd 3), if any.

    systemd keeps it across fhmon restarts, so clients' connects queue instead of
    failing while fhmon starts again.
    """
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    if os.environ.get("LISTEN_FDS") != "1":
        raise RegistrationRefused("socket activation: fhmon takes exactly one socket "
                                  f"(LISTEN_FDS={os.environ.get('LISTEN_FDS')})")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    raw = socket.socket(fileno=3)
    if raw.family != socket.AF_UNIX or raw.type != socket.SOCK_STREAM:
        raise RegistrationRefused("socket activation: fd 3 is not a unix stream socket")
    raw.set_inheritable(False)
    log.event("socket_activated", socket=raw.getsockname())
    return trio.socket.from_stdlib_socket(raw)
