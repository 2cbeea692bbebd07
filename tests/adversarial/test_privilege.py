"""Privilege: a target with a genuine handle asks for more than its own credentials allow.

Documented answers (docs/semantics.md): the open is checked with the target's own fsuid,
fsgid, groups and capabilities, never root's, so each answer must be the kernel's answer to
open(2) of the same file by the same process (the oracle, run by a plain uid-65534 agent).
Only the path permission is skipped, as opening by handle means. Devices, FIFOs and symlinks
get no handle at all (EOPNOTSUPP), and fhmon never opens one, so nothing can block it.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.adversarial.common import (
    AT_EMPTY_PATH,
    AT_HANDLE_FID,
    O_APPEND,
    O_CREAT,
    O_DIRECTORY,
    O_NOATIME,
    O_NONBLOCK,
    O_PATH,
    O_RDONLY,
    O_RDWR,
    O_TRUNC,
    O_WRONLY,
    PRIVILEGE,
    TRAILER,
    errname,
    n2h_errno,
    obh,
    obh_errno,
    private_file,
    signed,
    warm,
)
from tests.adversarial.recording import Recorder
from tests.support import Agent, Service, World
from tests.support.handles import N2HResult

FLAG_NAMES = {O_WRONLY: "O_WRONLY", O_RDWR: "O_RDWR", O_TRUNC: "O_TRUNC",
              O_APPEND: "O_APPEND", O_NOATIME: "O_NOATIME", O_PATH: "O_PATH",
              O_NONBLOCK: "O_NONBLOCK"}


def flag_text(flags: int) -> str:
    names = [name for bit, name in FLAG_NAMES.items() if flags & bit]
    return "|".join(names) if names else "O_RDONLY"


@pytest.fixture(scope="module")
def pair(world: World, fhmon: Service) -> Iterator[tuple[Agent, Agent]]:
    """The attacker under fhmon, and the same program on the kernel as the oracle."""
    fh = Agent(world, "fhmon", world.main, fhmon.socket)
    kernel = Agent(world, "plain", world.main)
    warm(fh)
    try:
        yield fh, kernel
    finally:
        fh.close()
        kernel.close()


def compare_open(fh: Agent, kernel: Agent, record: Recorder, path: str, flags: int,
                 expected: int, what: str, divergence: str = "") -> None:
    htype, handle = signed(fh, path)
    got = obh_errno(fh, htype, handle, flags=flags)
    oracle = kernel.call("probe_open", path=path, flags=flags)["errno"]
    note = f" (documented divergence: {divergence})" if divergence else ""
    record(PRIVILEGE, f"{what}: open by handle with {flag_text(flags)}{note}", expected,
           f"{errname(got)} (kernel open as uid 65534: {errname(oracle)})",
           ok=got == expected and (oracle == expected or bool(divergence)))


@pytest.mark.parametrize("path,flags,expected,what,divergence", [
    ("file", O_WRONLY, errno.EACCES, "a root-owned 0644 file", ""),
    ("file", O_RDWR, errno.EACCES, "a root-owned 0644 file", ""),
    ("file", O_WRONLY | O_APPEND, errno.EACCES, "a root-owned 0644 file", ""),
    ("file", O_NOATIME, errno.EPERM, "a root-owned 0644 file", ""),
    ("readonly", O_WRONLY, errno.EACCES, "a 0444 file", ""),
    ("readonly", O_RDWR, errno.EACCES, "a 0444 file", ""),
    ("rootonly", O_RDONLY, errno.EACCES, "a root-owned 0600 file", ""),
    ("rootonly", O_WRONLY, errno.EACCES, "a root-owned 0600 file", ""),
    ("rootonly", O_PATH, errno.EACCES, "a root-owned 0600 file",
     "no O_PATH fd can be injected; the kernel would give one"),
    ("dir", O_WRONLY, errno.EISDIR, "a directory", ""),
    ("dir", O_RDWR, errno.EISDIR, "a directory", ""),
])
def test_open_beyond_the_targets_rights(pair: tuple[Agent, Agent], record: Recorder,
                                        path: str, flags: int, expected: int, what: str,
                                        divergence: str) -> None:
    fh, kernel = pair
    compare_open(fh, kernel, record, path, flags, expected, what, divergence)


O_EXCL, O_TMPFILE = 0o200, 0o20200000


@pytest.mark.parametrize("path,flags,name,expected", [
    ("file", O_CREAT | O_EXCL, "O_CREAT|O_EXCL", errno.EEXIST),
    ("file", O_TMPFILE | O_RDWR, "O_TMPFILE|O_RDWR", errno.ENOTDIR),
    ("file", O_CREAT | O_DIRECTORY, "O_CREAT|O_DIRECTORY", errno.EINVAL),
    ("file", -1, "every flag bit (-1)", errno.ENOTDIR),
    ("dir", O_TMPFILE | O_RDWR, "O_TMPFILE|O_RDWR (an unnamed file in a root-owned dir)",
     errno.EACCES),
    ("dir", O_CREAT, "O_CREAT", errno.EISDIR),
    ("dir", -1, "every flag bit (-1, so O_PATH)", 0),
])
def test_odd_open_flags(pair: tuple[Agent, Agent], record: Recorder, path: str, flags: int,
                        name: str, expected: int) -> None:
    fh, kernel = pair
    htype, handle = signed(fh, path)
    got = obh_errno(fh, htype, handle, flags=flags)
    oracle = kernel.call("probe_open", path=path, flags=flags)["errno"]
    record(PRIVILEGE, f"open by handle of {path!r} with {name}", expected,
           f"{errname(got)} (kernel open as uid 65534: {errname(oracle)})",
           ok=got == oracle == expected)


def test_truncate_without_write_permission(pair: tuple[Agent, Agent], world: World,
                                           record: Recorder) -> None:
    fh, kernel = pair
    for mode, what in ((0o444, "a 0444 file"), (0o644, "a root-owned 0644 file")):
        with private_file(world.main / "adv_trunc", b"must survive\n", mode) as victim:
            for flags in (O_WRONLY | O_TRUNC, O_RDONLY | O_TRUNC, O_RDWR | O_TRUNC):
                compare_open(fh, kernel, record, "adv_trunc", flags, errno.EACCES, what)
                assert victim.read_bytes() == b"must survive\n"


def test_no_handles_for_devices_and_fifos(pair: tuple[Agent, Agent], spawn: Any,
                                          record: Recorder) -> None:
    fh, _ = pair
    root: Agent = spawn("plain", user=None)
    _, good = signed(fh, "file")
    for name, what in (("null", "a device node (/dev/null's numbers)"),
                       ("fifo", "a FIFO without a writer")):
        for flags, how in ((0, ""), (AT_HANDLE_FID, " with AT_HANDLE_FID")):
            start = time.monotonic()
            got = n2h_errno(fh, name, flags=flags)
            took = time.monotonic() - start
            record(PRIVILEGE, f"name_to_handle_at of {what}{how} (answered in < 2 s)",
                   errno.EOPNOTSUPP, f"{errname(got)} in {took * 1000:.0f} ms",
                   ok=got == errno.EOPNOTSUPP and took < 2)
        fh.call("open", name=f"opath_{name}", path=name, flags=O_PATH)
        record(PRIVILEGE, f"AT_EMPTY_PATH on an O_PATH fd of {what} (virtiofsd's own call)",
               errno.EOPNOTSUPP, n2h_errno(fh, "", dirfd=f"opath_{name}", flags=AT_EMPTY_PATH))
        fh.call("close", name=f"opath_{name}")
        raw = N2HResult.of(root.call("n2h", path=name))
        assert raw.errno == 0, raw
        htype = int(raw.handle_type or 0)
        for suffix, how in ((b"\0" * TRAILER, "+ 20 zero bytes"),
                            (good[-TRAILER:], "+ the trailer of a valid handle")):
            start = time.monotonic()
            got = obh_errno(fh, htype, raw.f_handle + suffix, flags=O_RDONLY)
            took = time.monotonic() - start
            record(PRIVILEGE, f"open_by_handle_at of {what}: root's kernel handle {how}",
                   errno.ESTALE, f"{errname(got)} in {took * 1000:.0f} ms",
                   ok=got == errno.ESTALE and took < 2)


def test_file_swapped_for_a_fifo_or_device_after_its_handle(pair: tuple[Agent, Agent],
                                                            world: World,
                                                            record: Recorder) -> None:
    fh, _ = pair
    swap = world.main / "adv_swap"
    for kind in ("fifo", "device"):
        with private_file(swap, b"regular at first\n"):
            htype, handle = signed(fh, "adv_swap")
            swap.unlink()
            if kind == "fifo":
                os.mkfifo(swap, 0o666)
            else:
                os.mknod(swap, 0o666 | 0o020000, os.makedev(1, 3))
            start = time.monotonic()
            got = obh_errno(fh, htype, handle, flags=O_RDONLY)
            took = time.monotonic() - start
            record(PRIVILEGE, f"a file's handle after the file was replaced by a {kind} "
                   f"of the same name (answered in < 2 s)", errno.ESTALE,
                   f"{errname(got)} in {took * 1000:.0f} ms",
                   ok=got == errno.ESTALE and took < 2)


def test_handles_skip_path_permission_only(pair: tuple[Agent, Agent], spawn: Any,
                                           world: World, record: Recorder) -> None:
    fh, _ = pair
    record(PRIVILEGE, "lookup of a file behind a directory without search permission",
           errno.EACCES, n2h_errno(fh, "noexec/hidden"))
    root: Agent = spawn(user=None)  # a root target of the same share, under fhmon
    htype, handle = signed(root, "noexec/hidden")
    opened = obh(fh, htype, handle)
    record(PRIVILEGE, "that file's handle, issued to a root target of the same share, opened "
           "by the uid-65534 target (documented: opening by handle skips path permission, "
           "as in the kernel; the file's own 0644 mode allows the read)", 0, opened["errno"])


# --- a target that enters its own user namespace ------------------------------------------------

class UsernsAgent(Agent):
    """The agent under fhmon, run as uid 65534 through `unshare -Ur`: root in its own user
    namespace, with a full CapEff there, and still uid 65534 (no capability) on the host."""

    def __init__(self, world: World, socket: str) -> None:
        super().__init__(world, "fhmon", world.main, socket, through=["unshare", "-Ur"])


@pytest.fixture(scope="module")
def userns_agent(world: World, fhmon: Service) -> Iterator[Agent]:
    agent = UsernsAgent(world, fhmon.socket)
    try:
        assert agent.hello["uid"] == 0  # root in its namespace
        warm(agent)
        yield agent
    finally:
        agent.close()


def test_user_namespace_target_is_still_confined(userns_agent: Agent,
                                                 record: Recorder) -> None:
    agent = userns_agent
    record(PRIVILEGE, "target in its own user namespace: lookup '../../outside/secret'",
           errno.EACCES, n2h_errno(agent, "../../outside/secret"))
    for path, flags in (("readonly", O_WRONLY), ("file", O_RDWR), ("rootonly", O_WRONLY)):
        htype, handle = signed(agent, path)
        got = obh_errno(agent, htype, handle, flags=flags)
        oracle = agent.call("probe_open", path=path, flags=flags)["errno"]
        record(PRIVILEGE, f"target in its own user namespace: open {path!r} with "
               f"{flag_text(flags)}", errno.EACCES,
               f"{errname(got)} (kernel open by the same process: {errname(oracle)})",
               ok=got == oracle == errno.EACCES)


USERNS_BUG = (
    "BUG: fhmon takes the target's capabilities from /proc/TID/status CapEff, which is "
    "relative to the target's own user namespace; a uid-65534 target that ran `unshare -Ur` "
    "shows a full CapEff there, and fhmon applies it in the initial namespace: its lookups "
    "and opens run with CAP_DAC_READ_SEARCH (fhmon's only kept DAC capability), so it reads "
    "root-only files and searches directories it may not")
USERNS_TITLE = "A target in its own user namespace gets fhmon's CAP_DAC_READ_SEARCH"
USERNS_FIX = (
    "count a target's capabilities only when its user namespace is the initial one (compare "
    "/proc/TID/ns/user with fhmon's own), else act with no capabilities; same for the "
    "registering client's credentials in pin_share. In monitor/proc_status.py read_status / "
    "monitor/credentials.py.")


@pytest.mark.finding(USERNS_TITLE, USERNS_FIX)
@pytest.mark.parametrize("case", ["read_rootonly", "lookup_behind_noexec"])
def test_user_namespace_capabilities_do_not_count_on_the_host(userns_agent: Agent,
                                                              record: Recorder,
                                                              case: str) -> None:
    agent = userns_agent
    if case == "read_rootonly":
        first = N2HResult.of(agent.call("n2h", path="rootonly"))
        got = obh_errno(agent, int(first.handle_type or 0), first.f_handle, flags=O_RDONLY)
        oracle = agent.call("probe_open", path="rootonly", flags=O_RDONLY)["errno"]
        what = "target in its own user namespace: read a root-owned 0600 file by handle"
    else:
        got = n2h_errno(agent, "noexec/hidden")
        oracle = agent.call("probe_open", path="noexec/hidden", flags=O_RDONLY)["errno"]
        what = "target in its own user namespace: lookup behind a directory without search"
    record(PRIVILEGE, what, errno.EACCES,
           f"{errname(got)} (kernel, same process: {errname(oracle)})",
           ok=got == oracle == errno.EACCES)

