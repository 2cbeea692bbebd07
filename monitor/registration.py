"""What a registration must satisfy before fhmon serves a listener: the fd is a seccomp
listener not yet registered; the target is the registering client's own (the client itself
or its child), proven by a pidfd (or, in fhmon's own pid namespace, a pid fhmon pins with a
pidfd of its own) and rechecked after /proc is read, so a reused pid proves nothing; it is a
live process under a filter that no other registered listener serves; the share is pinned as
that client would see it (the client's credentials open the target's root).

Only the host's root (uid 0 in fhmon's own pid and user namespaces: runc, an operator) may
name any process: a root pod is in other namespaces and proves ownership like anyone.
Refusals say nothing about other processes (no pids, no "runs under ..." of a process the
client does not own), so a scanner learns nothing from them.

The same uid policy holds at every call: monitor/handlers/caller_uid.py answers another
uid's call EPERM. Checks only: the Service (monitor/server.py) creates and serves the
Target afterwards.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import re
import select
from collections.abc import Iterable
from dataclasses import dataclass

from monitor import log
from monitor.calls import PeerCred, Target
from monitor.config import Config
from monitor.credentials import acting_as
from monitor.fdpass import close_quietly
from monitor.linux import kcmp_same_file, pidfd_open
from monitor.listener import is_seccomp_listener
from monitor.policy import RegistrationRefused, Share, pin_share
from monitor.proc_status import Credentials, read_status
from protocol import intake_wire, oci

NOT_THE_CLIENTS = ("the target does not belong to this client (it must be the client "
                   "itself or its child)")
# The client's pidfd, from SO_PEERPIDFD (monitor/intake.py): PEER_GONE when the kernel
# says the client has exited; None where the kernel has no SO_PEERPIDFD (before 6.5).
PEER_GONE = -1


@dataclass(frozen=True, slots=True)
class TargetClaim:
    """Which process the client says the target is: pid as the client named it (in its
    own pid namespace; 0: not given) and the target's pidfd if it sent one (fhmon's copy,
    owned and closed by check_registration)."""

    pid: int
    pidfd: int | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """A registration that passed: its pinned share and the target's pid in fhmon's pid
    namespace (which is not the claim's pid when the client is in another one)."""

    share: Share
    pid: int


def hello_listener(hello: intake_wire.Hello, fds: list[int]) -> tuple[int, TargetClaim]:
    """The listener fd a HELLO carried and its target; every fd is closed on refusal."""
    if hello.flags & ~intake_wire.HELLO_KNOWN_FLAGS:
        for fd in fds:
            close_quietly(fd)
        raise RegistrationRefused(f"unknown HELLO flags {hello.flags:#x}", errno.EINVAL)
    expected = intake_wire.hello_fd_count(hello.flags)
    if len(fds) != expected:
        for fd in fds:
            close_quietly(fd)
        what = ("exactly one fd (the listener)" if expected == 1 else
                "exactly two fds with TARGET_PIDFD (the listener, then the target's pidfd)")
        raise RegistrationRefused(f"HELLO must carry {what}, got {len(fds)}", errno.EINVAL)
    return fds[0], TargetClaim(hello.target_pid, fds[1] if expected == 2 else None)


def oci_listener(state: oci.ContainerProcessState, fds: list[int]) -> tuple[int, str]:
    """The listener fd (taken out of fds) and the share path of an OCI state message."""
    if len(fds) != len(state.fds):
        raise RegistrationRefused(f"state names {len(state.fds)} fds but {len(fds)} arrived",
                                  errno.EINVAL)
    share = oci.share_from_metadata(state.metadata)
    return fds.pop(state.seccomp_fd_index), share


def check_registration(listener_fd: int, claim: TargetClaim, share_path: str, peer: PeerCred,
                       targets: Iterable[Target], config: Config,
                       peer_credentials: Credentials | None = None,
                       expected_share_id: bytes | None = None,
                       peer_pidfd: int | None = None) -> Admitted:
    """Every check of a registration; the pinned share and the target's pid if it passes.
    Closes listener_fd and the claim's pidfd on refusal (RegistrationRefused), and on any
    other error (the pidfd always: fhmon keeps none).

    peer_credentials: for a registration restored from the keeper, whose client is gone:
    its target was proven the client's when first registered. expected_share_id: a
    re-registration's (after a restart) share id from its first registration: see
    _pin_expected. peer_pidfd: the client's pidfd (SO_PEERPIDFD), which shows that the
    process fhmon reads at the client's pid is still the one that connected.
    """
    target_pidfd = claim.pidfd
    try:
        registered = list(targets)
        if not is_seccomp_listener(listener_fd):
            raise RegistrationRefused("the fd is not a seccomp listener", errno.EINVAL)
        for other in registered:
            if kcmp_same_file(other.listener.fd, listener_fd):
                raise RegistrationRefused("this listener is already registered", errno.EEXIST)
        if len(registered) >= config.max_targets:
            raise RegistrationRefused("too many targets", errno.EAGAIN)
        restored = peer_credentials is not None
        if restored and _hung_up(listener_fd):  # its pid may name another process by now
            raise RegistrationRefused("the listener's filter has no task left (its target "
                                      "exited)", errno.ESRCH)
        if not restored and peer.pid <= 0:
            raise RegistrationRefused("fhmon cannot see the client's process (fhmon must run "
                                      "in the host's pid namespace)", errno.EPERM)
        host_root = not restored and peer.uid == 0 and _in_fhmon_namespaces(peer.pid)
        pid, target_pidfd = _identify(claim, peer, restored or host_root)
        try:
            target_status = read_status(pid)
            parent = _parent_pid(pid)
            if peer_credentials is None:
                peer_credentials = read_status(peer.pid).credentials
        except Exception:
            raise RegistrationRefused("the target or the client was not found (has it "
                                      "exited?)", errno.ESRCH) from None
        # What /proc said was about the processes the pidfds name (no pid was reused)
        if _pidfd_pids(target_pidfd)[:1] != (pid,) or target_status.tgid != pid:
            raise RegistrationRefused("the target is not a live process (it exited, or is a "
                                      "thread)", errno.ESRCH)
        if not restored and not _client_still_connected(peer_pidfd, peer.pid):
            raise RegistrationRefused("the client exited", errno.ESRCH)
        if not (restored or host_root) and peer.pid not in (pid, parent):
            raise RegistrationRefused(NOT_THE_CLIENTS, errno.EPERM)
        if claim.pidfd is not None and claim.pid != 0 and claim.pid != _pid_seen_by(
                target_pidfd, peer.pid):
            raise RegistrationRefused("the HELLO's target pid is not the pid of the pidfd "
                                      "it carries, as the client sees it", errno.EINVAL)
        holder = _listened_by(pid, registered)
        if holder is not None:
            raise RegistrationRefused(
                f"the target already runs under another seccomp notify listener (fhmon's "
                f"target {holder.target_id}, registered over {holder.convention}), and the "
                f"kernel allows a process only one (EBUSY): this listener cannot be its",
                errno.EBUSY)
        if not (restored or host_root) and peer.uid != 0 and target_status.uid != peer.uid:
            raise RegistrationRefused(NOT_THE_CLIENTS, errno.EPERM)
        if not target_status.seccomp_filtered:
            raise RegistrationRefused("the target runs under no seccomp filter: the listener "
                                      "does not belong to it", errno.EPERM)
        if expected_share_id is None:
            client = 0 if restored or host_root else peer.pid
            share = _pin_in(pid, share_path, config.allow, peer_credentials, client)
        else:
            share = _pin_expected(expected_share_id, (pid, peer.pid), share_path,
                                  config.allow, peer_credentials, trusted=restored or host_root)
        return Admitted(share, pid)
    except BaseException:
        close_quietly(listener_fd)
        raise
    finally:
        if target_pidfd is not None:
            close_quietly(target_pidfd)


def _hung_up(listener_fd: int) -> bool:
    poller = select.poll()
    poller.register(listener_fd, select.POLLIN)
    return any(events & (select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


def _identify(claim: TargetClaim, peer: PeerCred, trusted: bool) -> tuple[int, int]:
    """The target's pid in fhmon's pid namespace and a pidfd of it (fhmon's to close:
    the claim's, or one opened here). Without a pidfd from the client, the pid it named
    means something only if the client is in fhmon's pid namespace (or is trusted: the
    host's root, or a keeper record)."""
    if claim.pidfd is not None:
        if not _is_pidfd(claim.pidfd):
            raise RegistrationRefused("the HELLO's second fd is not a pidfd", errno.EINVAL)
        pids = _pidfd_pids(claim.pidfd)
        if not pids:
            raise RegistrationRefused("the target (of the pidfd sent) has exited, or is "
                                      "not in fhmon's pid namespace", errno.ESRCH)
        return pids[0], claim.pidfd
    if claim.pid <= 0:
        raise RegistrationRefused("invalid target pid", errno.EINVAL)
    if not trusted and not _in_fhmon_namespaces(peer.pid, ("pid",)):
        raise RegistrationRefused(
            "the client is in another pid namespace than fhmon: a pid it names means "
            "nothing here; send the target's pidfd with the HELLO (flag TARGET_PIDFD, as "
            "`fhmon launch` does)", errno.EINVAL)
    try:
        return claim.pid, pidfd_open(claim.pid)
    except OSError:
        raise RegistrationRefused("the target process was not found (has it exited?)",
                                  errno.ESRCH) from None


# --- processes, namespaces and pidfds, read from /proc (fhmon's pid namespace) -------------

def _namespace(pid: int | str, kind: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _in_fhmon_namespaces(pid: int, kinds: tuple[str, ...] = ("pid", "user")) -> bool:
    """Whether process pid is in fhmon's own namespaces of these kinds: uid 0 is the
    host's root only in fhmon's pid and user namespaces (not a root pod's)."""
    for kind in kinds:
        theirs = _namespace(pid, kind)
        if theirs is None or theirs != _namespace("self", kind):
            return False
    return True


_PPID = re.compile(rb"^PPid:[ \t]*(\d+)$", re.MULTILINE)
_NSPID = re.compile(rb"^NSpid:[ \t]*([^\n]*)$", re.MULTILINE)
_PID = re.compile(rb"^Pid:[ \t]*(-?\d+)$", re.MULTILINE)


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(65536)


def _parent_pid(pid: int) -> int:
    found = _PPID.search(_read(f"/proc/{pid}/status"))
    if found is None:
        raise ValueError(f"no PPid in /proc/{pid}/status")
    return int(found[1])


def nspids(text: bytes) -> tuple[int, ...] | None:
    """A process's pids from its /proc status or a pidfd's fdinfo: in fhmon's pid
    namespace first, then in each nested one down to its own. () when it has exited or
    is not visible from fhmon's namespace (the kernel's -1 and 0); None when the text has
    no pid (not a pidfd's fdinfo). Sans-IO."""
    found = _PID.search(text)
    if found is None:
        return None
    if int(found[1]) <= 0:
        return ()
    listed = _NSPID.search(text)
    try:
        pids = tuple(int(p) for p in listed[1].split()) if listed else (int(found[1]),)
    except ValueError:
        return None
    return pids if pids and pids[0] == int(found[1]) and min(pids) > 0 else ()


def _pidfd_pids(pidfd: int) -> tuple[int, ...]:
    try:
        return nspids(_read(f"/proc/self/fdinfo/{pidfd}")) or ()
    except OSError:
        return ()


def _is_pidfd(fd: int) -> bool:
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
        fdinfo = _read(f"/proc/self/fdinfo/{fd}")
    except OSError:
        return False
    return ((link == "anon_inode:[pidfd]" or link.startswith("pidfd:"))
            and nspids(fdinfo) is not None)


def _client_still_connected(peer_pidfd: int | None, pid: int) -> bool:
    """Whether the process at the client's pid is still the one that connected (its
    SO_PEERPIDFD still names that pid); None: a kernel without SO_PEERPIDFD, unchecked."""
    if peer_pidfd is None:
        return True
    return peer_pidfd != PEER_GONE and _pidfd_pids(peer_pidfd)[:1] == (pid,)


def _pid_seen_by(target_pidfd: int, client: int) -> int | None:
    """The target's pid in the client's pid namespace (the client's own, or an ancestor of
    the target's: the target is the client or its child), None if not there."""
    try:
        client_pids = nspids(_read(f"/proc/{client}/status"))  # "Pid:", as fdinfo's
    except OSError:
        return None
    target_pids = _pidfd_pids(target_pidfd)
    if not client_pids or len(target_pids) < len(client_pids):
        return None
    return target_pids[len(client_pids) - 1]


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


def _pin_in(pid: int, share_path: str, allow: list[str], credentials: Credentials,
            client: int = 0) -> Share:
    """pin_share in the mount namespace of process pid, as the registering client
    (client: its pid; 0 when it is trusted, the host's root or a keeper record: fhmon
    then opens the target's root itself)."""
    root_fd = _open_root(pid, credentials, client)
    try:
        with acting_as(credentials):
            return pin_share(root_fd, share_path, allow, pid)
    finally:
        os.close(root_fd)


def _open_root(pid: int, credentials: Credentials, client: int) -> int:
    """/proc/PID/root, as the client could open it. fhmon's own CAP_SYS_PTRACE opens
    anyone's; the client's credentials are tried first (the kernel's ptrace read check).
    That check cannot be replayed exactly from fhmon's thread (it compares capabilities
    held in the target's user namespace), so a refusal is overruled when the target has
    nothing over the client: its every uid and gid is the client's fsuid and fsgid, and it
    holds no capability the client lacks in fhmon's user namespace (a child that made
    itself root of its own user namespace, as the client could look into). A target
    the client may not look into that shares the client's mount namespace and root (a
    child that changed its uid before exec is not dumpable) is resolved in the client's
    own root: the same view, as the client has it."""
    path = f"/proc/{pid}/root"
    if client <= 0:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        with acting_as(credentials):
            return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        refusal = exc
    if _nothing_over(pid, credentials):
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    if client != pid and _same_view(pid, client):
        try:
            with acting_as(credentials):
                return os.open(f"/proc/{client}/root", os.O_PATH | os.O_CLOEXEC)
        except OSError:
            pass
    raise RegistrationRefused(f"the client cannot see the target's root: "
                              f"{refusal.strerror}", refusal.errno or errno.EACCES)


_IDS = re.compile(rb"^(Uid|Gid|CapPrm):[ \t]*([^\n]*)$", re.MULTILINE)


def _nothing_over(pid: int, credentials: Credentials) -> bool:
    """Whether process pid's credentials give it nothing over the client's: one uid and
    one gid everywhere, the client's fsuid and fsgid, and, in fhmon's user namespace, no
    permitted capability beyond the client's effective ones (in a user namespace of its
    own, its capabilities count there only)."""
    try:
        fields = dict(_IDS.findall(_read(f"/proc/{pid}/status")))
        uids = {int(u) for u in fields[b"Uid"].split()}
        gids = {int(g) for g in fields[b"Gid"].split()}
        permitted = int(fields[b"CapPrm"], 16)
    except (OSError, KeyError, ValueError):
        return False
    if _in_fhmon_namespaces(pid, ("user",)) and permitted & ~credentials.cap_effective:
        return False
    return uids == {credentials.fsuid} and gids == {credentials.fsgid}


def _same_view(pid: int, client: int) -> bool:
    """Whether process pid sees the file system as the client does: one mount namespace,
    one root directory (compared by fhmon, which may look)."""
    try:
        roots = [os.stat(f"/proc/{p}/root") for p in (pid, client)]
    except OSError:
        return False
    mine, theirs = _namespace(pid, "mnt"), _namespace(client, "mnt")
    return (mine is not None and mine == theirs
            and (roots[0].st_dev, roots[0].st_ino) == (roots[1].st_dev, roots[1].st_ino))


def _pin_expected(expected: bytes, pids: tuple[int, int], share_path: str, allow: list[str],
                  credentials: Credentials, trusted: bool = False) -> Share:
    """A re-registration binds to the share of the first registration, whatever the target
    did to its own mount namespace since (it may have mounted another allowed share, or
    anything else, over its share path). The share path is resolved in the target's
    namespace, then, unless that gave the expected share id, in the registering client's,
    which the target cannot change (pids: target, client; a client pid of 0, a keeper
    record, has none); a share with another id is refused (ESTALE). trusted: the client
    is the host's root or a keeper record (see _pin_in)."""
    seen: list[str] = []
    for pid in pids:
        if pid <= 0:
            continue
        try:
            share = _pin_in(pid, share_path, allow, credentials, 0 if trusted else pids[1])
        except RegistrationRefused as exc:
            seen.append(exc.reason)
            continue
        if hmac.compare_digest(share.facts.share_id, expected):
            if pid != pids[0]:
                log.event("share_pinned_in_client_namespace", logging.WARNING,
                          share=share.facts.host_path, target_saw="; ".join(seen))
            return share
        seen.append(f"host path {share.facts.host_path} is another share")
        share.close()
    raise RegistrationRefused(f"share {share_path} is not the share this listener was first "
                              f"registered with ({'; '.join(seen)})", errno.ESTALE)
