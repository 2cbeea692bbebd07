"""`fhmon keeper`: holds copies of listeners so that they outlive fhmon restarts.

When the last copy of a listener closes, the kernel fails every call of that filter with
ENOSYS forever. `fhmon launch` keeps a copy itself; a container runtime (runc) does not.
fhmon deposits a copy of every such listener here; a restarted fhmon withdraws them all
and serves them again. The keeper never reads notifications: holding a copy grants nothing
(it runs as root beside fhmon, in the same trust domain). A listener whose filter has no
task left (POLLHUP) is dropped.

When first told of a target the keeper opens a pidfd for its pid, and it acts on the
process only through that pidfd: when a new fhmon withdraws the listeners, the calls the
dead fhmon had received but not answered are restarted (SIGSTOP, then SIGCONT, sent with
pidfd_send_signal) before the listener is handed over. A pid number alone could by then
name another user's process; a pidfd names one process, and once that one has exited
every signal through it fails with ESRCH.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from dataclasses import dataclass
from typing import Any

import trio

from monitor import fdpass, log
from monitor.linux import kcmp_same_file, pidfd_open
from monitor.listener import Listener, is_seccomp_listener
from monitor.stuck_calls import restart_stuck_calls
from protocol import keeper as wire


@dataclass
class Held:
    listener: Listener
    target: dict[str, Any]
    pidfd: int | None  # the target process, opened when the keeper was first told of it

    def close(self) -> None:
        self.listener.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Keeper:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.held: list[Held] = []

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            if stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            raw.bind(self.socket_path)
        finally:
            os.umask(old)
        raw.listen(16)
        sock = trio.socket.from_stdlib_socket(raw)
        try:
            async with trio.open_nursery() as nursery:
                log.event("keeper_serving", socket=self.socket_path)
                task_status.started()
                while True:
                    conn, _ = await sock.accept()
                    nursery.start_soon(self._client, conn, nursery)
        finally:
            sock.close()
            for held in self.held:
                held.close()

    async def _client(self, conn: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        peer_uid = int.from_bytes(creds[4:8], "little")
        decoder = wire.Decoder()
        fds: list[int] = []
        try:
            if peer_uid != 0:
                return  # only root (fhmon) deposits or withdraws listeners
            while True:
                data, ancdata, _, _ = await conn.recvmsg(65536, fdpass.space(4))
                fds.extend(fdpass.fds_from_ancdata(ancdata))
                if not data:
                    return
                decoder.feed(data)
                while (message := decoder.next_message()) is not None:
                    if message["op"] == "deposit" and fds:
                        self._deposit(fds.pop(0), message.get("target", {}), nursery)
                    elif message["op"] == "withdraw":
                        await self._withdraw(conn)
        except (OSError, trio.BrokenResourceError, wire.KeeperProtocolError):
            pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _deposit(self, fd: int, target: dict[str, Any], nursery: trio.Nursery) -> None:
        if not is_seccomp_listener(fd) or any(kcmp_same_file(h.listener.fd, fd)
                                             for h in self.held):
            os.close(fd)
            return
        held = Held(Listener(fd), target, _open_pidfd(target.get("pid")))
        self.held.append(held)
        log.event("keeper_holds", target=target, held=len(self.held))
        nursery.start_soon(self._watch, held)

    async def _watch(self, held: Held) -> None:
        """Drop a listener once no task uses its filter (POLLHUP)."""
        try:
            while not held.listener.hung_up():
                await trio.sleep(1.0)
        finally:
            self.held.remove(held)
            held.close()
            log.event("keeper_dropped", logging.DEBUG, target=held.target)

    async def _withdraw(self, conn: trio.socket.SocketType) -> None:
        for held in list(self.held):
            if held.pidfd is not None:
                await restart_stuck_calls(held.pidfd, int(held.target.get("pid", 0)))
            # restarted: fhmon must not do it again (by pid); an old keeper never says so
            frame = wire.encode({"op": "listener", "target": held.target, "restarted": True})
            await conn.sendmsg([frame], fdpass.rights([held.listener.fd]))
        await conn.send(wire.encode({"op": "end", "count": len(self.held)}))


def _open_pidfd(pid: Any) -> int | None:
    """A pidfd for the target's process, or None if there is none (it exited already)."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        return pidfd_open(pid)
    except OSError as exc:
        log.event("keeper_no_pidfd", logging.WARNING, pid=pid, error=exc.strerror,
                  hint="its stuck calls will not be restarted")
        return None

