"""Passing fds over unix sockets (SCM_RIGHTS): one place for the ancillary-data details."""

from __future__ import annotations

import array
import contextlib
import os
import socket
from collections.abc import Iterable
from typing import Any


def rights(fds: Iterable[int]) -> list[tuple[int, int, bytes]]:
    """The ancillary data that carries fds with a sendmsg."""
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", list(fds)).tobytes())]


def send_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    sock.sendmsg([data], rights([fd]))


def fds_from_ancdata(ancdata: Iterable[tuple[int, int, bytes]]) -> list[int]:
    """Every fd the kernel installed in us from one recvmsg's ancillary data."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % arr.itemsize])
            fds.extend(arr)
    return fds


def space(max_fds: int) -> int:
    """The ancillary buffer size for up to max_fds fds."""
    return socket.CMSG_SPACE(max_fds * array.array("i").itemsize)


def recv_fds(sock: socket.socket, size: int, max_fds: int) -> tuple[bytes, list[int], Any]:
    """A blocking recvmsg: (data, fds, msg_flags)."""
    data, ancdata, msg_flags, _ = sock.recvmsg(size, space(max_fds))
    return data, fds_from_ancdata(ancdata), msg_flags


def close_quietly(fd: int) -> None:
    """Close an fd that may already be gone (a client's, a peer's): nothing to report."""
    with contextlib.suppress(OSError):
        os.close(fd)
