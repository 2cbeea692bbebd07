"""Real seccomp listeners for intake tests: a child installs the filter and hands us the fd."""

from __future__ import annotations

import array
import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

from monitor import seccomp_filter
from protocol import intake_wire


@dataclass
class FilteredChild:
    pid: int
    listener: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.listener)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def filtered_child(uid: int = 65534) -> FilteredChild:
    """A child (uid) under the handle filter that just sleeps; we hold its listener."""
    pid, fd, channel = seccomp_filter.fork_under_filter((uid, uid))
    channel.detach()  # keep the child's socket end alive: it waits on it
    return FilteredChild(pid, fd)


def send_raw(sock_path: str, data: bytes, fds: list[int] | None = None,
             timeout: float = 5.0, close_write: bool = False) -> bytes:
    """Send bytes (+fds) to fhmon and return whatever it answers before closing/timeout."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(sock_path)
        if fds:
            sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        elif data:
            sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + timeout
        decoder = intake_wire.FrameDecoder()
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
            try:
                decoder.feed(chunk)
                if decoder.next_message() is not None:
                    break
            except intake_wire.ProtocolError:
                break
        return out


def hello(share: str, pid: int, version: int = intake_wire.PROTOCOL_VERSION) -> bytes:
    return intake_wire.encode(intake_wire.Hello(pid, share, "test", version=version))


@contextlib.contextmanager
def registered_children(sock_path: str, share: str, count: int) -> Iterator[list[FilteredChild]]:
    """count filtered children, each registered with HELLO (accepted) over its own raw
    connection; all killed and their listeners closed afterwards."""
    children: list[FilteredChild] = []
    try:
        for _ in range(count):
            child = filtered_child()
            children.append(child)
            answer = intake_wire.decode_one(send_raw(sock_path, hello(share, child.pid),
                                                     [child.listener]))
            assert isinstance(answer, intake_wire.Accept), answer
        yield children
    finally:
        for child in children:
            child.close()
