"""`fhmon serve`'s end of its worker processes (`workers = N`): spawn, talk, stop.

The worker program itself is monitor/worker_program.py (`python -m monitor.worker_program`);
the messages between the two are protocol/worker.py. fhmon serve keeps one WorkerProcess per
worker: it sends it every registered target and every key change, merges its reports, and
stops the service if it ends.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from monitor import fdpass
from protocol import worker as wire

if TYPE_CHECKING:
    from monitor.calls import Target


class WorkerStartError(RuntimeError):
    """A worker process did not get ready."""


class WorkerProcess:
    """`fhmon serve`'s end of one worker: the process and its control socket."""

    def __init__(self, process: trio.Process, control: socket.socket) -> None:
        self.process = process
        self.control = control

    @classmethod
    async def spawn(cls, start: wire.Start, receive_lock_fd: int) -> WorkerProcess:
        """receive_lock_fd: the file behind every worker's SharedReceiveLock."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "monitor.worker_program", str(theirs.fileno()),
                 str(receive_lock_fd)], pass_fds=(theirs.fileno(), receive_lock_fd))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.sendall(wire.encode(start))
        ours.setblocking(False)
        return cls(process, ours)

    def add(self, target: Target) -> None:
        share = target.share
        message = wire.AddTarget(
            target.target_id, target.pid, target.peer.pid, target.peer.uid, target.peer.gid,
            target.convention, share.facts)
        self._send(wire.encode(message), [target.listener.fd, share.path_fd, share.dir_fd])

    def remove(self, target: Target) -> None:
        self._send(wire.encode(wire.RemoveTarget(target.target_id)))

    def reload_keys(self) -> None:
        self._send(wire.encode(wire.ReloadKeys()))

    def _send(self, data: bytes, fds: list[int] | None = None) -> None:
        # Small messages on a socket the worker always reads: blocking briefly is fine.
        self.control.setblocking(True)
        try:
            self.control.sendmsg([data], fdpass.rights(fds) if fds else [])
        finally:
            self.control.setblocking(False)

    async def _next_message(self) -> wire.Message | None:
        """The worker's next message; None once it closed its end, or died with a message
        of ours unread (ECONNRESET)."""
        while True:
            await trio.lowlevel.wait_readable(self.control)
            try:
                data = self.control.recv(wire.MAX_MESSAGE)
            except BlockingIOError:
                continue
            except OSError:
                return None
            return wire.decode(data) if data else None

    async def ready(self) -> None:
        """Wait for the worker's Ready: its keys are loaded and it answers calls.

        Until every worker is ready fhmon serve accepts no registration: a worker whose
        start failed (say the key directory broke in between) must stop the start-up, not
        a service that already serves.
        """
        message = await self._next_message()
        if message is None:
            raise WorkerStartError(f"worker {self.process.pid} ended before it was ready "
                                   f"(its worker_failed event says why)")
        if not isinstance(message, wire.Ready):
            raise WorkerStartError(f"worker {self.process.pid} sent "
                                   f"{type(message).__name__} before Ready")

    async def reports(self, merge: Callable[[wire.Report], None]) -> None:
        """Merge every report until the worker closes its end."""
        while (message := await self._next_message()) is not None:
            if isinstance(message, wire.Report):
                merge(message)

    async def stop(self, grace: float = 5.0) -> None:
        """Close the control socket (the worker finishes its call and exits), then wait."""
        self.control.close()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
