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

import errno
import os
import pwd
import signal
import socket
import struct
import sys
from dataclasses import dataclass

import trio

from monitor import fdpass, seccomp_filter
from monitor.stuck_calls import restart_stuck_calls_of
from protocol import native

REGISTRATION_TIMEOUT = 30.0


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


def launch(socket_path: str, share: str, user: UserSpec | None, argv: list[str]) -> int:
    if not argv:
        raise LaunchError("no command given after --")
    try:
        pid, listener, channel = seccomp_filter.fork_under_filter(
            (user.uid, user.gid) if user is not None else None, argv,
            timeout=REGISTRATION_TIMEOUT)
    except (OSError, seccomp_filter.FilterSetupError) as exc:
        raise LaunchError(f"could not install the filter: {exc}") from None
    try:
        return trio.run(_supervise, socket_path, share, pid, listener, channel, argv)
    except BaseException:
        _reap(pid, kill=True)
        raise
    finally:
        os.close(listener)
        channel.close()


def _reap(pid: int, *, kill: bool) -> None:
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass


class Registration:
    """The launcher's side of a registration: one open connection to fhmon, renewed when it
    drops. The listener copy stays here for the target's whole life."""

    def __init__(self, socket_path: str, share: str, pid: int, listener: int) -> None:
        self.socket_path = socket_path
        self.share = share
        self.pid = pid
        self.listener = listener
        self.sock: trio.socket.SocketType | None = None
        # the first ACCEPT's share id: every re-registration must land on that share
        self.share_id: bytes | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    async def register(self) -> native.Message:
        """Connect, send HELLO with the listener and the child's pidfd, return the answer
        (connection kept)."""
        self.close()
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            await sock.connect(self.socket_path)
            server_is_root(sock, self.socket_path)  # before the listener leaves this process
            # The child's pidfd proves to fhmon which process the target is, in whatever
            # pid namespace this launcher runs (self.pid is only this namespace's pid).
            hello = native.encode(native.Hello(self.pid, self.share,
                                               f"fhmon-launch/{os.getpid()}",
                                               flags=native.HELLO_TARGET_PIDFD,
                                               share_id=self.share_id))
            pidfd = os.pidfd_open(self.pid)
            try:
                await sock.sendmsg([hello], fdpass.rights([self.listener, pidfd]))
            finally:
                os.close(pidfd)
            decoder = native.FrameDecoder()
            while (message := decoder.next_message()) is None:
                data = await sock.recv(65536)
                if not data:
                    raise LaunchError("fhmon closed the connection without answering")
                decoder.feed(data)
        except BaseException:
            sock.close()
            raise
        if isinstance(message, native.Accept):
            self.sock = sock
            if self.share_id is None:
                self.share_id = message.share_id
        else:
            sock.close()
        return message

    async def wait_lost(self) -> None:
        """Return when fhmon closes the connection (it stopped or died)."""
        assert self.sock is not None
        try:
            while await self.sock.recv(4096):
                pass
        except OSError:
            pass
        self.close()

    async def stay_registered(self) -> None:
        """When fhmon goes away, register again with backoff, then re-kick stuck calls.

        While no fhmon holds the listener, the target's trapped calls wait (this process
        holds a copy, so the filter never loses its last listener).
        """
        while True:
            await self.wait_lost()
            print("fhmon launch: connection to fhmon lost; registering again", file=sys.stderr)
            # The old fhmon is gone (EOF comes when its fds close): re-kick its unanswered
            # calls now, while no fhmon can be answering any call, so that the restart
            # never races a live answer.
            await restart_stuck_calls_of(self.pid)  # our child: its pid is still its
            delay = 0.02
            refused = ""
            while True:
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    answer = await self.register()
                except OSError:
                    continue
                except LaunchError as exc:
                    if str(exc) != refused:  # once per reason, not once per retry
                        refused = str(exc)
                        print(f"fhmon launch: {refused}", file=sys.stderr)
                    continue
                if isinstance(answer, native.Accept):
                    break
                print(f"fhmon launch: re-registration refused: "
                      f"{getattr(answer, 'reason', answer)}", file=sys.stderr)
            print("fhmon launch: registered again", file=sys.stderr)


def server_is_root(sock: trio.socket.SocketType, socket_path: str) -> None:
    """Refuse to hand the listener to anything but root: the kernel's SO_PEERCRED names the
    process that bound and listens on the socket. Whoever holds the listener answers the
    target's calls, so a socket replaced by another user (a writable socket directory, a
    wrong path) must not get it."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", raw)
    if uid != 0:
        raise LaunchError(f"the server at {socket_path} runs as uid {uid} (pid {pid}), not "
                          f"root: refusing to hand it the listener (is that fhmon's socket?)")



async def _supervise(socket_path: str, share: str, pid: int, listener: int,
                     channel: socket.socket, argv: list[str]) -> int:
    registration = Registration(socket_path, share, pid, listener)
    with trio.move_on_after(REGISTRATION_TIMEOUT) as scope:
        try:
            answer = await registration.register()
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
    seccomp_filter.go(channel)
    failed = seccomp_filter.exec_outcome(await _read_to_eof(channel))
    if failed is not None:
        code, command = failed
        os.waitpid(pid, 0)
        print(f"fhmon launch: {exec_failure_message(code, command)}", file=sys.stderr)
        return seccomp_filter.exec_exit_status(code)
    pidfd = os.pidfd_open(pid)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_forward_signals, pid)
            nursery.start_soon(registration.stay_registered)
            await trio.lowlevel.wait_readable(pidfd)
            _, status = os.waitpid(pid, 0)
            nursery.cancel_scope.cancel()
    finally:
        os.close(pidfd)
        registration.close()
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


async def _read_to_eof(channel: socket.socket) -> bytes:
    """Everything the child writes until its end closes (on exec, or when it exits)."""
    data = b""
    while True:
        await trio.lowlevel.wait_readable(channel)
        try:
            chunk = channel.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk


def exec_failure_message(code: int, command: str) -> str:
    """One line for a command that could not be executed: errno name, path, and a hint."""
    name = errno.errorcode.get(code, str(code))
    text = f"cannot execute {command}: {name} ({os.strerror(code)})"
    if code in (errno.ENOENT, errno.ENOTDIR):
        where = "on PATH" if "/" not in command else "at that path"
        text += (f"; not found {where}: is virtiofsd installed? Distributions put it in "
                 f"/usr/libexec/virtiofsd, which is not on PATH, so give the full path")
    elif code == errno.EACCES:
        text += "; check that it is executable by the --user given and not on a noexec mount"
    return text


async def _forward_signals(pid: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for sig in signals:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
