"""open_by_handle_at through fhmon vs. the kernel.

Two oracles: (1) for the checks made before any file is touched (header EFAULT, sizes,
type, EBADF, ESTALE) the kernel's own open_by_handle_at as root with the raw kernel handle;
(2) for the open itself, the kernel's open(2) of the same file by the same uid (65534):
fhmon must grant what the target's own credentials grant, never root's.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import Agent, World
from tests.support.handles import TRAILER, N2HResult

O_RDONLY, O_WRONLY, O_RDWR = 0, 1, 2
O_DIRECTORY, O_PATH, O_CLOEXEC = 0o200000, 0o10000000, 0o2000000
O_TRUNC, O_APPEND, O_NOATIME, O_NONBLOCK = 0o1000, 0o2000, 0o1000000, 0o4000


@pytest.fixture(scope="module")
def trio_of_agents(world: World, fhmon: Any,
                   request: pytest.FixtureRequest) -> tuple[Agent, Agent, Agent]:
    fh = Agent(world, "fhmon", world.main, fhmon.socket)
    nobody = Agent(world, "plain", world.main)
    root = Agent(world, "plain", world.main, user=None)
    for agent in (fh, root):
        agent.call("open", name="opath", path=".", flags=O_PATH)
        agent.call("open", name="regular", path="file", flags=O_RDONLY)
        agent.call("open", name="procfs", path="/proc", flags=O_RDONLY)
    for agent in (fh, nobody, root):
        request.addfinalizer(agent.close)
    return fh, nobody, root


def handles(fh: Agent, root: Agent, path: str) -> tuple[int, bytes, bytes]:
    signed = N2HResult.of(fh.call("n2h", path=path))
    raw = N2HResult.of(root.call("n2h", path=path))
    assert signed.errno == 0 and raw.errno == 0, (signed, raw)
    assert signed.handle_type == raw.handle_type
    return int(raw.handle_type or 0), signed.f_handle, raw.f_handle


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(place=st.sampled_from(["normal", "normal", "end_of_page", "straddle", "unmapped",
                              "null", "readonly", "kernel"]),
       hb=st.sampled_from([None, None, 0, 129, 2**31, 2**32 - 1, 4]),
       htype=st.sampled_from([None, None, -1, 0x40000, 0x10000 | 1, 0x20000 | 1]),
       mount_fd=st.sampled_from(["share", "share", "cwd", "opath", "regular", "procfs", 999,
                                 -1, -100]),
       path=st.sampled_from(["file", "dir", "dir/deep/leaf"]))
def test_checks_before_the_open_match_kernel(trio_of_agents: tuple[Agent, Agent, Agent],
                                             place: str, hb: int | None, htype: int | None,
                                             mount_fd: Any, path: str) -> None:
    fh, _, root = trio_of_agents
    handle_type, signed, raw = handles(fh, root, path)
    common: dict[str, Any] = {"handle_place": place, "mount_fd": mount_fd, "flags": O_RDONLY}
    if htype is not None:
        common["handle_type"] = htype
    else:
        common["handle_type"] = handle_type
    k_call = {**common, "f_handle": raw.hex()}
    f_call = {**common, "f_handle": signed.hex()}
    if hb is not None:
        k_call["handle_bytes"] = f_call["handle_bytes"] = hb
    if place == "readonly":  # the kernel reads the handle fine from a read-only page
        return
    k = root.call("obh", **k_call)
    f = fh.call("obh", **f_call)
    context = f"kernel={k} fhmon={f} call={f_call}"
    if k["errno"] == 0:
        # Types with user flags change what the kernel decodes: fhmon's MAC covers the type.
        if htype is not None and htype != handle_type:
            assert f["errno"] == errno.ESTALE, context
            return
        if hb == 4:  # a lie about the size: the MAC covers the length -> ESTALE
            assert f["errno"] == errno.ESTALE, context
            return
        assert f["errno"] == 0, context
        assert (f["dev"], f["ino"]) == (k["dev"], k["ino"]), context
    elif hb == 4 and k["errno"] == errno.ESTALE:
        assert f["errno"] == errno.ESTALE, context
    else:
        assert f["errno"] == k["errno"], context


CASES = ["file", "readonly", "rootonly", "writeonly", "nobodys", "dir", "emptydir",
         "dir/deep/leaf"]
FLAGS = [O_RDONLY, O_WRONLY, O_RDWR, O_RDONLY | O_DIRECTORY, O_WRONLY | O_TRUNC,
         O_RDONLY | O_CLOEXEC, O_WRONLY | O_APPEND, O_RDONLY | O_NOATIME, O_RDWR | O_NONBLOCK]


# O_TRUNC on writable fixture files would change them for other tests; the truncating
# case has its own test with a private file below.
_WRITABLE = ("file", "nobodys", "dir/deep/leaf", "writeonly")
PERMISSION_CASES = [(p, f) for p in CASES for f in FLAGS if not (f & O_TRUNC and p in _WRITABLE)]


@pytest.mark.parametrize("path,flags", PERMISSION_CASES)
def test_open_permissions_are_the_targets_own(trio_of_agents: tuple[Agent, Agent, Agent],
                                              world: World, path: str, flags: int) -> None:
    fh, nobody, root = trio_of_agents
    _, signed, _ = handles(fh, root, path)
    before = (world.main / path).stat()
    oracle = nobody.call("probe_open", path=str(world.main / path), flags=flags)
    got = fh.call("obh", f_handle=signed.hex(), handle_type=handles(fh, root, path)[0],
                  flags=flags)
    context = f"oracle={oracle} fhmon={got}"
    assert got["errno"] == oracle["errno"], context
    if oracle["errno"] == 0:
        for key in ("dev", "ino", "type", "accmode", "cloexec", "o_path", "nonblock",
                    "append"):
            assert got[key] == oracle[key], f"{key}: {context}"
        assert got.get("head") == oracle.get("head"), context
    after = (world.main / path).stat()
    assert after.st_size == before.st_size


def test_truncate_only_with_write_permission(trio_of_agents: tuple[Agent, Agent, Agent],
                                             world: World) -> None:
    fh, _, root = trio_of_agents
    victim = world.main / "truncate_me"
    victim.write_text("some bytes\n")
    victim.chmod(0o644)
    htype, signed, _ = handles(fh, root, "truncate_me")
    got = fh.call("obh", f_handle=signed.hex(), handle_type=htype, flags=O_WRONLY | O_TRUNC)
    assert got["errno"] == errno.EACCES
    assert victim.stat().st_size == 11
    os.chown(victim, 65534, 65534)
    got = fh.call("obh", f_handle=signed.hex(), handle_type=htype, flags=O_WRONLY | O_TRUNC)
    assert got["errno"] == 0 and victim.stat().st_size == 0
    victim.unlink()


@pytest.mark.parametrize("path,expect_errno,expect_type,expect_acc", [
    ("dir", 0, "dir", O_RDONLY),
    ("file", 0, "reg", O_RDONLY),
    ("writeonly", 0, "reg", O_WRONLY),
    ("rootonly", errno.EACCES, None, None),  # neither readable nor owned: refused
])
def test_o_path_requests_get_a_usable_fd(trio_of_agents: tuple[Agent, Agent, Agent],
                                         path: str, expect_errno: int,
                                         expect_type: str | None,
                                         expect_acc: int | None) -> None:
    """ADDFD cannot carry O_PATH files: see docs/semantics.md for what O_PATH gets."""
    fh, _, root = trio_of_agents
    htype, signed, _ = handles(fh, root, path)
    for extra in (0, O_CLOEXEC):
        got = fh.call("obh", f_handle=signed.hex(), handle_type=htype, flags=O_PATH | extra)
        assert got["errno"] == expect_errno, got
        if expect_errno == 0:
            assert got["type"] == expect_type and got["accmode"] == expect_acc, got
            assert got["cloexec"] == bool(extra), got


def test_o_path_directory_flag_on_a_file(trio_of_agents: tuple[Agent, Agent, Agent]) -> None:
    fh, _, root = trio_of_agents
    htype, signed, raw = handles(fh, root, "file")
    k = root.call("obh", f_handle=raw.hex(), handle_type=htype, flags=O_PATH | O_DIRECTORY)
    f = fh.call("obh", f_handle=signed.hex(), handle_type=htype, flags=O_PATH | O_DIRECTORY)
    assert k["errno"] == f["errno"] == errno.ENOTDIR


def test_each_success_adds_exactly_one_fd(trio_of_agents: tuple[Agent, Agent, Agent]) -> None:
    fh, _, root = trio_of_agents
    htype, signed, _ = handles(fh, root, "file")
    before = fh.call("fdcount")["fds"]
    for _ in range(50):
        assert fh.call("obh", f_handle=signed.hex(), handle_type=htype)["errno"] == 0
        assert fh.call("obh", f_handle=(signed[:-1] + bytes([signed[-1] ^ 1])).hex(),
                       handle_type=htype)["errno"] == errno.ESTALE
    assert fh.call("fdcount")["fds"] == before


def test_trailer_length(trio_of_agents: tuple[Agent, Agent, Agent]) -> None:
    fh, _, root = trio_of_agents
    _, signed, raw = handles(fh, root, "file")
    assert len(signed) == len(raw) + TRAILER


def test_o_path_on_own_inodes_without_permission(trio_of_agents: tuple[Agent, Agent, Agent],
                                                 world: World) -> None:
    """virtiofsd keeps O_PATH fds to its own chmod-000 files and execute-only directories
    (and chmods them back through those fds): the owner gets a read-only fd, because it
    could chmod itself read access anyway; a non-owner does not."""
    fh, _, root = trio_of_agents
    mine = world.main / "mine000"
    mine.write_text("mine\n")
    os.chown(mine, 65534, 65534)
    xdir = world.main / "xdir311"
    xdir.mkdir()
    os.chown(xdir, 65534, 65534)
    theirs = world.main / "theirs000"
    theirs.write_text("theirs\n")
    try:
        htype_m, mine_h, _ = handles(fh, root, "mine000")
        htype_x, xdir_h, _ = handles(fh, root, "xdir311")
        htype_t, theirs_h, _ = handles(fh, root, "theirs000")
        mine.chmod(0)
        xdir.chmod(0o311)
        theirs.chmod(0)
        got = fh.call("obh", f_handle=mine_h.hex(), handle_type=htype_m, flags=O_PATH)
        assert got["errno"] == 0 and got["type"] == "reg", got
        got = fh.call("obh", f_handle=xdir_h.hex(), handle_type=htype_x, flags=O_PATH)
        assert got["errno"] == 0 and got["type"] == "dir", got
        # without O_PATH the target's own permissions rule, as the kernel's
        got = fh.call("obh", f_handle=mine_h.hex(), handle_type=htype_m, flags=O_RDONLY)
        assert got["errno"] == errno.EACCES
        got = fh.call("obh", f_handle=theirs_h.hex(), handle_type=htype_t, flags=O_PATH)
        assert got["errno"] == errno.EACCES
        subprocess.run(["chattr", "+i", str(mine)], check=True)
        try:
            got = fh.call("obh", f_handle=mine_h.hex(), handle_type=htype_m, flags=O_PATH)
            assert got["errno"] == errno.EACCES  # immutable: not even the owner can chmod it
        finally:
            subprocess.run(["chattr", "-i", str(mine)], check=True)
    finally:
        xdir.chmod(0o755)
        xdir.rmdir()
        mine.unlink()
        theirs.unlink()


@pytest.mark.parametrize("then", [("opath", ".", O_PATH, errno.EBADF),
                                  ("procfs", "/proc", O_RDONLY, errno.ESTALE),
                                  ("share again", ".", O_RDONLY | O_DIRECTORY, 0)])
def test_a_mount_fd_number_reused_for_another_file(trio_of_agents: tuple[Agent, Agent, Agent],
                                                   then: tuple[str, str, int, int]) -> None:
    """fhmon remembers the target's last mount_fd (one kcmp instead of pidfd_getfd, F_GETFL,
    fstat, close); the target then closes that fd and opens something else under the same
    number. The answer must be the kernel's for what the number names now, not for what it
    named (a memo keyed on the number alone answers the O_PATH and /proc cases 0)."""
    fh, _, root = trio_of_agents
    _, name, flags, expected = then
    htype, signed, raw = handles(fh, root, "file")
    answers = []
    for agent, f_handle in ((root, raw), (fh, signed)):
        first = agent.call("open", name="mnt", path=".", flags=O_RDONLY | O_DIRECTORY)
        ok = agent.call("obh", f_handle=f_handle.hex(), handle_type=htype, mount_fd="mnt")
        agent.call("close", name="mnt")
        again = agent.call("open", name="mnt", path=name, flags=flags)
        assert again["ret"] == first["ret"], (first, again)  # the same number, reused
        got = agent.call("obh", f_handle=f_handle.hex(), handle_type=htype, mount_fd="mnt")
        agent.call("close", name="mnt")
        assert ok["errno"] == 0, ok
        answers.append(got["errno"])
    assert answers == [expected, expected], answers


def test_threads_of_one_target_with_different_fsgids(world: World, fhmon: Any) -> None:
    """One target whose threads differ in fsgid, calls interleaved: each open gets what that
    thread's own open(2) gets. The native plane leaves the last switch's fsgid on its thread
    (native/src/creds.rs Lingering) and switches only when the next caller's differs; a
    stale one would open the group-only file for the wrong thread, or refuse the right one.
    The target is uid 65534 on the host in a user namespace of its own whose gid map (set
    by this test, root) holds two host gids, 65534 and 65533."""
    gid_a, gid_b = 65534, 65533
    name = "group_b_only"
    path = world.main / name
    path.write_bytes(b"for group b\n")
    os.chown(path, 0, gid_b)
    path.chmod(0o040)  # group read, nothing for the owner (root) or others
    root = Agent(world, "plain", world.main, user=None)
    fh = Agent(world, "fhmon", world.main, fhmon.socket)
    try:
        assert fh.call("unshare_user")["errno"] == 0
        Path(f"/proc/{fh.pid}/uid_map").write_text("0 65534 1\n")
        Path(f"/proc/{fh.pid}/gid_map").write_text(f"0 {gid_a} 1\n1 {gid_b} 1\n")
        inner = {gid_a: 0, gid_b: 1}  # the host gid as the target's namespace names it
        handle_type, signed, _ = handles(fh, root, name)
        got: list[tuple[int, int, int]] = []
        for gid in [gid_b, gid_a, gid_a, gid_b, gid_b, gid_a, gid_b, gid_a] * 3:
            oracle = fh.call("thread_call", fsgid=inner[gid],
                             call={"op": "probe_open", "path": str(path), "flags": O_RDONLY})
            answer = fh.call("thread_call", fsgid=inner[gid],
                             call={"op": "obh", "f_handle": signed.hex(),
                                   "handle_type": handle_type, "flags": O_RDONLY})
            assert answer["fsgid"] == inner[gid], answer
            got.append((gid, oracle["errno"], answer["errno"]))
        assert all(o == a for _, o, a in got), got
        # the oracle itself tells the two apart: the test is about something
        assert {(g, o) for g, o, _ in got} == {(gid_b, 0), (gid_a, errno.EACCES)}, got
    finally:
        fh.close()
        root.close()
        path.unlink()
