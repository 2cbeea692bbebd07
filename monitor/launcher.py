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
from pathlib import Path
from typing import Any, Literal

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


HandleMode = Literal["prefer", "mandatory"]
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FAIL_OPEN_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Options:
    """How `fhmon launch` runs CMD (see docs/kubevirt.md, "The launcher").

    fail_open: whenever fhmon cannot serve CMD (unreachable, silent, refusing, no filter, or
    the start-up probe fails), exec CMD exactly as given, in this process, after one line
    on stderr, instead of exiting 125.
    virtiofsd_handles: once fhmon serves, run CMD with --inode-file-handles=MODE (CMD's own
    such flag replaced); CMD as given otherwise.
    migration_by_handle: once fhmon serves, also turn a --migration-mode CMD already has into
    --migration-mode=file-handles (both ends of a migration must then be under fhmon).
    registration_timeout: how long fhmon may take to answer, and the probe to complete.
    """

    fail_open: bool = False
    virtiofsd_handles: HandleMode | None = None
    migration_by_handle: bool = False
    registration_timeout: float = REGISTRATION_TIMEOUT


@dataclass(frozen=True, slots=True)
class FallBack:
    """fhmon cannot serve CMD; why, in words for the operator."""

    reason: str


def served_argv(argv: list[str], options: Options) -> list[str]:
    """CMD as it runs when fhmon serves it: virtiofsd's handle flags per `options`.

    --inode-file-handles goes last (before a "--", if any), not right after argv[0]: CMD
    may be virtiofsd behind a loader or wrapper (`ld.so --library-path DIR virtiofsd ...`)
    whose own options come first.
    """
    if options.virtiofsd_handles is None and not options.migration_by_handle:
        return list(argv)
    out = argv[:1]
    rest: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        if arg == "--":
            rest = [arg, *args]
            break
        if options.virtiofsd_handles is not None and (
                arg == "--inode-file-handles" or arg.startswith("--inode-file-handles=")):
            if "=" not in arg:
                next(args, None)
            continue
        if options.migration_by_handle and (
                arg == "--migration-mode" or arg.startswith("--migration-mode=")):
            # Only where CMD already asks for a mode: a virtiofsd without migration
            # support would refuse the flag.
            if "=" not in arg:
                next(args, None)
            out.append("--migration-mode=file-handles")
            continue
        out.append(arg)
    if options.virtiofsd_handles is not None:
        out.append(f"--inode-file-handles={options.virtiofsd_handles}")
    return out + rest


NATIVE_LAUNCHER = Path(__file__).resolve().parent / "_bin" / "fhmon-launch"


def native_argv(socket_path: str, share: str, user: UserSpec | None, argv: list[str],
                options: Options) -> list[str]:
    """The native launcher's command line for what `fhmon launch` was asked (ids resolved
    here, through NSS, so that names mean what they meant before)."""
    out = [str(NATIVE_LAUNCHER), "launch", "--socket", socket_path, "--share", share]
    if user is not None:
        out += ["--user", f"{user.uid}:{user.gid}"]
    if options.fail_open:
        out.append("--fail-open")
    if options.virtiofsd_handles is not None:
        out.append(f"--virtiofsd-handles={options.virtiofsd_handles}")
    if options.migration_by_handle:
        out.append("--virtiofsd-migration=file-handles")
    return [*out, f"--registration-timeout={options.registration_timeout!r}", "--", *argv]


def launch(socket_path: str, share: str, user: UserSpec | None, argv: list[str],
           options: Options = Options()) -> int:
    """Run argv registered with fhmon; its exit status (128+N for a signal N).

    SIGTERM, SIGINT and SIGHUP are blocked from before the fork until the receiver that
    forwards them exists: one that arrives in between waits instead of killing the launcher
    (which would leave CMD running without its parent). The child restores the mask just
    before exec.
    """
    if not argv:
        raise LaunchError("no command given after --")
    ids = (user.uid, user.gid) if user is not None else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        try:
            pid, listener, channel = seccomp_filter.fork_under_filter(
                ids, argv, timeout=options.registration_timeout, signal_mask=mask)
        except (OSError, seccomp_filter.FilterSetupError) as exc:
            outcome: int | FallBack = FallBack(f"could not install the filter: {exc}")
        else:
            try:
                outcome = trio.run(_supervise, socket_path, share, pid, listener, channel,
                                   argv, options, mask)
            except BaseException:
                _reap(pid, kill=True)
                raise
            finally:
                os.close(listener)
                channel.close()
        if isinstance(outcome, int):
            return outcome
        if not options.fail_open:
            raise LaunchError(outcome.reason)
        print(f"fhmon launch: running {argv[0]} without fhmon (no file handles): "
              f"{outcome.reason}", file=sys.stderr, flush=True)
        return exec_unserved(argv, ids, mask)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def exec_unserved(argv: list[str], user: tuple[int, int] | None, mask: set[int]) -> int:
    """Become argv exactly as given, in this process (no filter: it is only ever installed
    in the child): the original command line runs as if fhmon were not there. Returns only
    when exec fails, with the shell's status for that."""
    for sig in seccomp_filter.RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    try:
        if user is not None:
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending SIGTERM ends us here
        os.execvp(argv[0], argv)
    except OSError as exc:
        code = exc.errno or errno.ENOEXEC
        print(f"fhmon launch: {exec_failure_message(code, argv[0])}", file=sys.stderr)
        return seccomp_filter.exec_exit_status(code)
    raise AssertionError("unreachable: execvp returned")


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



class _Stopped(Exception):
    """A forwarded signal arrived before CMD ran: stop without running it."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


async def _supervise(socket_path: str, share: str, pid: int, listener: int,
                     channel: socket.socket, argv: list[str], options: Options,
                     mask: set[int]) -> int | FallBack:
    """Register, probe (fail-open only), let the child exec, then stay its parent."""
    registration = Registration(socket_path, share, pid, listener)
    pidfd = os.pidfd_open(pid)
    try:
        with trio.open_signal_receiver(*FORWARDED_SIGNALS) as signals:
            # Pending signals now reach `signals`, nothing in between kills this process.
            signal.pthread_sigmask(signal.SIG_SETMASK, mask - set(FORWARDED_SIGNALS))
            async with trio.open_nursery() as nursery:
                started = trio.Event()
                before_start = trio.CancelScope()
                stop: list[int] = []
                nursery.start_soon(_forward_signals, signals, pid, started, before_start,
                                   stop)
                with before_start:
                    outcome = await _start(registration, channel, pid, argv, options, started)
                if stop:
                    _reap(pid, kill=True)
                    nursery.cancel_scope.cancel()
                    return 128 + stop[0]
                if isinstance(outcome, (int, FallBack)):
                    _reap(pid, kill=True)  # the child never ran CMD: never left waiting
                    nursery.cancel_scope.cancel()
                    return outcome
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


async def _start(registration: Registration, channel: socket.socket, pid: int,
                 argv: list[str], options: Options,
                 started: trio.Event) -> int | FallBack | None:
    """Everything before CMD runs: None once it does, an exit status if its exec failed,
    FallBack if fhmon cannot serve it. `started` is set as the child is told to exec: from
    then on signals are CMD's."""
    where = registration.socket_path
    with trio.move_on_after(options.registration_timeout) as scope:
        try:
            answer = await registration.register()
        except OSError as exc:
            return FallBack(f"cannot reach fhmon at {where}: {exc.strerror}")
        except LaunchError as exc:
            return FallBack(str(exc))
    if scope.cancelled_caught:
        return FallBack(f"fhmon at {where} did not answer within "
                        f"{options.registration_timeout:g}s")
    if isinstance(answer, native.Refuse):
        return FallBack(f"fhmon refused the registration: {answer.reason} "
                        f"({errno.errorcode.get(answer.errno, answer.errno)})")
    if not isinstance(answer, native.Accept):
        return FallBack(f"fhmon answered {type(answer).__name__}, not ACCEPT")
    command = argv
    if options.fail_open:
        failed: str | None = None
        seccomp_filter.ask_probe(channel, registration.share)
        with trio.move_on_after(options.registration_timeout):
            failed = await _read_probe(channel)
            if failed:
                return FallBack(f"registered, but the start-up probe failed: {failed}")
            command = served_argv(argv, options)
        if failed is None:
            return FallBack(f"registered, but the start-up probe got no answer within "
                            f"{options.registration_timeout:g}s (is it {where} that holds "
                            f"the listener?)")
    else:
        command = served_argv(argv, options)
    seccomp_filter.go(channel, command)
    started.set()
    failed_exec = seccomp_filter.exec_outcome(await _read_to_eof(channel))
    if failed_exec is not None:
        code, name = failed_exec
        os.waitpid(pid, 0)
        print(f"fhmon launch: {exec_failure_message(code, name)}", file=sys.stderr)
        return seccomp_filter.exec_exit_status(code)
    return None


async def _read_probe(channel: socket.socket) -> str:
    """The child's answer to ask_probe: "" for success, else why not."""
    data = b""
    while (outcome := seccomp_filter.probe_outcome(data)) is None:
        await trio.lowlevel.wait_readable(channel)
        try:
            chunk = channel.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError as exc:
            return f"the child's channel failed: {exc.strerror}"
        if not chunk:
            return "the child exited during the probe"
        data += chunk
    return outcome


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


async def _forward_signals(signals: Any, pid: int, started: trio.Event,
                           before_start: trio.CancelScope, stop: list[int]) -> None:
    """Pass each signal to CMD once it runs; one that comes before stops the launch."""
    async for sig in signals:
        if not started.is_set():
            stop.append(sig)
            before_start.cancel()
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
