"""`fhmon launch`'s Python side: the native launcher's path and command line, and copying it
for KubeVirt's pods (`fhmon install-launcher`).

The launch itself is native/launcher (`fhmon-launch`, docs/kubevirt.md "The launcher"):

    fork ─ child: drop to --user, NO_NEW_PRIVS, load filter (NEW_LISTENER), pass the
           listener to the parent, close it, wait for "go", exec CMD
         └ parent: register the listener with fhmon (HELLO + SCM_RIGHTS), tell the child to
           go only after ACCEPT, then stay CMD's parent: forward SIGTERM/SIGINT/SIGHUP, keep
           the listener and the connection (re-register if fhmon restarts), exit with CMD's
           status.

`fhmon launch` checks its arguments here (the same messages as ever) and then becomes that
executable, so that the command line and KubeVirt's pods run one launcher.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


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
    registration_timeout: how long fhmon may take to answer, and the probe to complete;
    None leaves the default to the native launcher (30 s, 5 s with fail_open).
    """

    fail_open: bool = False
    virtiofsd_handles: HandleMode | None = None
    migration_by_handle: bool = False
    registration_timeout: float | None = None


NATIVE_LAUNCHER = Path(__file__).resolve().parent / "_bin" / "fhmon-launch"
INSTALLED_NAME = "fhmon-launch"


def install(dest: str | os.PathLike[str]) -> Path:
    """`fhmon install-launcher DIR`: DIR (created, or emptied: an init container that runs
    again starts clean) holds the native launcher alone, a static executable that needs
    nothing of the image it runs in. Returns its path."""
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    target = root / INSTALLED_NAME
    partial = root / f".{INSTALLED_NAME}.partial"
    shutil.copyfile(NATIVE_LAUNCHER, partial)
    partial.chmod(0o755)
    partial.rename(target)
    return target


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
    if options.registration_timeout is not None:
        out.append(f"--registration-timeout={options.registration_timeout!r}")
    return [*out, "--", *argv]
