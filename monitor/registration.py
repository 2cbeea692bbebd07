"""What a registration must satisfy before fhmon serves a listener: the fd is a seccomp
listener not yet registered, of a live process under a filter that no other registered
listener serves, owned by the registering client's uid (unless root), and the share is
pinned as that client would see it.

The same uid policy holds at every call: monitor/handlers/caller_uid.py answers another
uid's call EPERM. Checks only: the Service (monitor/server.py) creates and serves the
Target afterwards.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
from collections.abc import Iterable

from monitor import log
from monitor.calls import PeerCred, Target
from monitor.config import Config
from monitor.credentials import acting_as
from monitor.fdpass import close_quietly
from monitor.linux import kcmp_same_file
from monitor.listener import is_seccomp_listener
from monitor.policy import RegistrationRefused, Share, pin_share
from monitor.proc_status import Credentials, read_status
from protocol import native, oci


def hello_listener(hello: native.Hello, fds: list[int]) -> int:
    """The listener fd a HELLO carried; every fd is closed on refusal."""
    if len(fds) != 1:
        for fd in fds:
            close_quietly(fd)
        raise RegistrationRefused(
            f"HELLO must carry exactly one fd (the listener), got {len(fds)}", errno.EINVAL)
    if hello.flags & ~native.HELLO_KNOWN_FLAGS:
        close_quietly(fds[0])
        raise RegistrationRefused(f"unknown HELLO flags {hello.flags:#x}", errno.EINVAL)
    return fds[0]


def oci_listener(state: oci.ContainerProcessState, fds: list[int]) -> tuple[int, str]:
    """The listener fd (taken out of fds) and the share path of an OCI state message."""
    if len(fds) != len(state.fds):
        raise RegistrationRefused(f"state names {len(state.fds)} fds but {len(fds)} arrived",
                                  errno.EINVAL)
    share = oci.share_from_metadata(state.metadata)
    return fds.pop(state.seccomp_fd_index), share


def pid_in_our_namespace(target_pid: int, peer_pid: int) -> int:
    """A HELLO's target pid, which the client wrote as its own pid namespace numbers it, as
    fhmon's pid namespace numbers it (the kernel translates only SO_PEERCRED's pid).

    A launcher in a container (every Kubernetes container has a pid namespace of its own)
    names its child by the container's numbers: the process is found among those sharing the
    client's pid namespace, by the last NSpid of /proc/PID/status (its pid there). Refused
    (ESRCH) when no such process exists or the client's namespace cannot be read.
    """
    try:
        theirs = os.stat(f"/proc/{peer_pid}/ns/pid")
        ours = os.stat("/proc/self/ns/pid")
    except OSError:
        raise RegistrationRefused(f"process {peer_pid}'s pid namespace cannot be read",
                                  errno.ESRCH) from None
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        return target_pid
    wanted = str(target_pid).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry}/ns/pid")
            if (ns.st_dev, ns.st_ino) != (theirs.st_dev, theirs.st_ino):
                continue
            with open(f"/proc/{entry}/status", "rb") as handle:
                nspid = next((line.split()[1:] for line in handle
                              if line.startswith(b"NSpid:")), [])
        except OSError:
            continue   # gone meanwhile
        if nspid and nspid[-1] == wanted:
            return int(entry)
    raise RegistrationRefused(f"process {target_pid} not found in the pid namespace of "
                              f"process {peer_pid}", errno.ESRCH)


def check_registration(listener_fd: int, target_pid: int, share_path: str, peer: PeerCred,
                       targets: Iterable[Target], config: Config,
                       peer_credentials: Credentials | None = None,
                       expected_share_id: bytes | None = None) -> Share:
    """Every check of a registration; the pinned share if it passes. Closes listener_fd
    on refusal (RegistrationRefused), and on any other error.

    peer_credentials: for a registration restored from the keeper, whose client is gone.
    expected_share_id: a re-registration's (after a restart) share id from its first
    registration: see _pin_expected.
    """
    try:
        registered = list(targets)
        if not is_seccomp_listener(listener_fd):
            raise RegistrationRefused("the fd is not a seccomp listener", errno.EINVAL)
        for other in registered:
            if kcmp_same_file(other.listener.fd, listener_fd):
                raise RegistrationRefused("this listener is already registered", errno.EEXIST)
        holder = _listened_by(target_pid, registered)
        if holder is not None:
            raise RegistrationRefused(
                f"process {target_pid} already runs under another seccomp notify listener "
                f"(fhmon's target {holder.target_id}, registered over {holder.convention}), "
                f"and the kernel allows a process only one (EBUSY): this listener cannot "
                f"be its", errno.EBUSY)
        if len(registered) >= config.max_targets:
            raise RegistrationRefused("too many targets", errno.EAGAIN)
        if target_pid <= 0:
            raise RegistrationRefused("invalid target pid", errno.EINVAL)
        try:
            target_status = read_status(target_pid)
            if peer_credentials is None:
                peer_credentials = read_status(peer.pid).credentials
        except Exception:
            raise RegistrationRefused(f"process {target_pid} or {peer.pid} not found",
                                      errno.ESRCH) from None
        if peer.uid != 0 and target_status.uid != peer.uid:
            raise RegistrationRefused(f"process {target_pid} does not belong to uid "
                                      f"{peer.uid}", errno.EPERM)
        if not target_status.seccomp_filtered:
            raise RegistrationRefused(f"process {target_pid} runs under no seccomp filter: "
                                      f"the listener does not belong to it", errno.EPERM)
        if expected_share_id is None:
            return _pin_in(target_pid, share_path, config.allow, peer_credentials)
        return _pin_expected(expected_share_id, (target_pid, peer.pid), share_path,
                             config.allow, peer_credentials)
    except BaseException:
        close_quietly(listener_fd)
        raise


def _listened_by(pid: int, targets: Iterable[Target]) -> Target | None:
    """The target whose listener already serves process `pid`, if any. A second
    NEW_LISTENER in a process under one fails with EBUSY, so another listener named for
    that process is not its (a runtime wired to fhmon twice, or a confused client).
    The registered process must be the one that lives under `pid` now: its filter
    still has a task, and `pid` started before that registration (not a reused pid)."""
    for other in targets:
        if other.pid != pid or other.listener.hung_up():
            continue
        started = _process_start_time(pid)
        if started is not None and started <= other.registered_at + 1.0:  # btime: 1 s
            return other
    return None
def _process_start_time(pid: int) -> float | None:
    """When process `pid` started (wall clock, to the second of the boot time)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            ticks = int(handle.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _pin_in(pid: int, share_path: str, allow: list[str], credentials: Credentials) -> Share:
    """pin_share in the mount namespace of process pid, as the registering client."""
    try:
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise RegistrationRefused(f"cannot see process {pid}'s root: {exc.strerror}",
                                  errno.ESRCH) from None
    try:
        with acting_as(credentials):
            return pin_share(root_fd, share_path, allow, pid)
    finally:
        os.close(root_fd)


def _pin_expected(expected: bytes, pids: tuple[int, int], share_path: str, allow: list[str],
                  credentials: Credentials) -> Share:
    """A re-registration binds to the share of the first registration, whatever the target
    did to its own mount namespace since (it may have mounted another allowed share, or
    anything else, over its share path). The share path is resolved in the target's
    namespace, then, unless that gave the expected share id, in the registering client's,
    which the target cannot change (pids: target, client; a client pid of 0, a keeper
    record, has none); a share with another id is refused (ESTALE)."""
    seen: list[str] = []
    for pid in pids:
        if pid <= 0:
            continue
        try:
            share = _pin_in(pid, share_path, allow, credentials)
        except RegistrationRefused as exc:
            seen.append(exc.reason)
            continue
        if hmac.compare_digest(share.share_id, expected):
            if pid != pids[0]:
                log.event("share_pinned_in_client_namespace", logging.WARNING,
                          share=share.host_path, target_saw="; ".join(seen))
            return share
        seen.append(f"host path {share.host_path} is another share")
        share.close()
    raise RegistrationRefused(f"share {share_path} is not the share this listener was first "
                              f"registered with ({'; '.join(seen)})", errno.ESTALE)
