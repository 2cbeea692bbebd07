"""`fhmon launch`: run a command under the handle filter, registered with fhmon.

    fork ─ child: drop to --user, NO_NEW_PRIVS, load filter (NEW_LISTENER), pass the
           listener to the parent, close it, wait for "go", exec CMD
         └ parent: register the listener with fhmon (HELLO + SCM_RIGHTS), tell the child to
           go only after ACCEPT, then stay CMD's parent: forward SIGTERM/SIGINT/SIGHUP, keep
           the listener and the connection (re-register if fhmon restarts), exit with CMD's
           status.

The child never keeps the listener: a target holding its own listener could answer its
own trapped calls.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import pwd
import signal
import socket
import sys
from dataclasses import dataclass

import trio

from monitor import seccomp_filter
from protocol import native

REGISTRATION_TIMEOUT = 30.0
_CHILD_OK = b"L"
_CHILD_ERR = b"E"
_GO = b"G"


class LaunchError(Exception):
    """Launching failed before CMD ran; the message is for the operator."""


@dataclass(frozen=True, slots=True)
class UserSpec:
    uid: int
    gid: int


def parse_user(text: str) -> UserSpec:
    name, _, group = text.partition(":")
    try:
        uid = int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid
    except KeyError:
        raise LaunchError(f"no user {name!r}") from None
    if group:
        if not group.isdigit():
            import grp
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError:
                raise LaunchError(f"no group {group!r}") from None
        else:
            gid = int(group)
    else:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
    return UserSpec(uid, gid)


def _send_fd(sock: socket.socket, data: bytes, fd: int) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def _recv_fd(sock: socket.socket, size: int = 4096) -> tuple[bytes, list[int]]:
    data, ancdata, _, _ = sock.recvmsg(size, socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(payload[: len(payload) - len(payload) % 4])
            fds.extend(arr)
    return data, fds


def _child(channel: socket.socket, user: UserSpec | None, argv: list[str]) -> None:
    """Runs in the forked child; never returns."""
    try:
        program = seccomp_filter.build_program()
        if user is not None:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
        listener = seccomp_filter.install(program)
        _send_fd(channel, _CHILD_OK, listener)
        os.close(listener)
        if channel.recv(1) != _GO:
            os._exit(126)  # the parent gave up (registration refused or fhmon absent)
        channel.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        os.execvp(argv[0], argv)
    except BaseException as exc:  # report to the parent, then die without cleanup handlers
        with contextlib.suppress(OSError):
            channel.sendall(_CHILD_ERR + f"{argv[0]}: {exc}".encode(errors="replace"))
        os._exit(127)


def launch(socket_path: str, share: str, user: UserSpec | None, argv: list[str]) -> int:
    if not argv:
        raise LaunchError("no command given after --")
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        parent_end.close()
        _child(child_end, user, argv)
    child_end.close()
    listener = -1
    try:
        parent_end.settimeout(REGISTRATION_TIMEOUT)
        data, fds = _recv_fd(parent_end)
        if data[:1] != _CHILD_OK or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            reason = data[1:].decode(errors="replace") or "the child exited"
            raise LaunchError(f"could not install the filter: {reason}")
        listener = fds[0]
        return trio.run(_supervise, socket_path, share, pid, listener, parent_end, argv)
    except BaseException:
        _reap(pid, kill=True)
        raise
    finally:
        if listener >= 0:
            os.close(listener)
        parent_end.close()


def _reap(pid: int, *, kill: bool) -> None:
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


async def _register(socket_path: str, share: str, pid: int, listener: int) -> native.Message:
    """Connect, send HELLO with the listener, return the answer (connection kept open)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    await sock.connect(socket_path)
    hello = native.encode(native.Hello(pid, share, f"fhmon-launch/{os.getpid()}"))
    await sock.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  array.array("i", [listener]))])
    decoder = native.FrameDecoder()
    while (message := decoder.next_message()) is None:
        data = await sock.recv(65536)
        if not data:
            sock.close()
            raise LaunchError("fhmon closed the connection without answering")
        decoder.feed(data)
    _CONNECTION.append(sock)
    return message


_CONNECTION: list[trio.socket.SocketType] = []


async def _supervise(socket_path: str, share: str, pid: int, listener: int,
                     channel: socket.socket, argv: list[str]) -> int:
    with trio.move_on_after(REGISTRATION_TIMEOUT) as scope:
        try:
            answer = await _register(socket_path, share, pid, listener)
        except OSError as exc:
            raise LaunchError(f"cannot reach fhmon at {socket_path}: {exc.strerror}") from None
    if scope.cancelled_caught:
        raise LaunchError(f"fhmon at {socket_path} did not answer within "
                          f"{REGISTRATION_TIMEOUT:.0f}s")
    if isinstance(answer, native.Refuse):
        raise LaunchError(f"fhmon refused the registration: {answer.reason} "
                          f"({errno.errorcode.get(answer.errno, answer.errno)})")
    if not isinstance(answer, native.Accept):
        raise LaunchError(f"fhmon answered {type(answer).__name__}, not ACCEPT")
    channel.sendall(_GO)
    pidfd = os.pidfd_open(pid)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_forward_signals, pid)
            nursery.start_soon(_stay_registered, socket_path, share, pid, listener)
            await trio.lowlevel.wait_readable(pidfd)
            _, status = os.waitpid(pid, 0)
            nursery.cancel_scope.cancel()
    finally:
        os.close(pidfd)
        for sock in _CONNECTION:
            sock.close()
        _CONNECTION.clear()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


async def _forward_signals(pid: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for sig in signals:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return


async def _stay_registered(socket_path: str, share: str, pid: int, listener: int) -> None:
    """Watch the connection; when fhmon goes away, register again with backoff.

    While no fhmon holds the listener, the target's trapped calls simply wait (the launcher
    holds a copy, so the filter never sees its last listener close).
    """
    delay = 0.05
    while True:
        sock = _CONNECTION[-1] if _CONNECTION else None
        if sock is not None:
            try:
                while await sock.recv(4096):
                    pass
            except OSError:
                pass
            sock.close()
            _CONNECTION.clear()
            print("fhmon launch: connection to fhmon lost; registering again", file=sys.stderr)
        while True:
            await trio.sleep(delay)
            try:
                answer = await _register(socket_path, share, pid, listener)
            except (OSError, LaunchError):
                delay = min(delay * 2, 2.0)
                continue
            if isinstance(answer, native.Accept):
                print("fhmon launch: registered again", file=sys.stderr)
                delay = 0.05
                break
            print(f"fhmon launch: re-registration refused: "
                  f"{getattr(answer, 'reason', answer)}", file=sys.stderr)
            for s in _CONNECTION:
                s.close()
            _CONNECTION.clear()
            delay = min(delay * 2, 2.0)
