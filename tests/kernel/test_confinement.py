"""Signed handles and share confinement, attacked from a real target (uid 65534).

Outcomes asserted here are the documented ones (docs/semantics.md): forged or foreign
handles -> ESTALE; lookups that land outside the share -> EACCES; submounts inside the
share -> EOPNOTSUPP; magic links -> ELOOP.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Service, World
from tests.support.handles import N2HResult

O_RDONLY, O_PATH = 0, 0o10000000
AT_SYMLINK_FOLLOW, AT_HANDLE_FID = 0x400, 0x200


def signed(agent: Agent, path: str, **kw: Any) -> tuple[int, bytes]:
    r = N2HResult.of(agent.call("n2h", path=path, **kw))
    assert r.errno == 0, r
    return int(r.handle_type or 0), r.f_handle


def open_errno(agent: Agent, htype: int, f_handle: bytes, **kw: Any) -> int:
    return int(agent.call("obh", handle_type=htype, f_handle=f_handle.hex(), **kw)["errno"])


@pytest.fixture
def target(spawn: Any) -> Agent:
    agent: Agent = spawn()
    return agent


class TestForgery:
    def test_every_bit_flip_is_stale(self, target: Agent) -> None:
        htype, good = signed(target, "file")
        assert open_errno(target, htype, good) == 0
        for bit in range(len(good) * 8):
            forged = bytearray(good)
            forged[bit // 8] ^= 1 << (bit % 8)
            assert open_errno(target, htype, bytes(forged)) == errno.ESTALE, bit

    def test_random_truncated_extended_and_retyped(self, target: Agent) -> None:
        htype, good = signed(target, "dir/inner")
        rng = random.Random(7)
        cases = [rng.randbytes(len(good)) for _ in range(50)]
        cases += [good[:n] for n in range(1, len(good))]
        cases += [good + b"\0", good + rng.randbytes(20), b"\0" * len(good)]
        for forged in cases:
            assert open_errno(target, htype, forged) == errno.ESTALE, forged.hex()
        assert open_errno(target, htype + 1, good) == errno.ESTALE
        assert open_errno(target, htype, good, handle_bytes=len(good) - 4) == errno.ESTALE

    def test_a_raw_kernel_handle_is_stale(self, target: Agent, spawn: Any) -> None:
        root: Agent = spawn("plain", user=None)
        raw = N2HResult.of(root.call("n2h", path="file"))
        assert raw.errno == 0
        assert open_errno(target, int(raw.handle_type or 0), raw.f_handle) == errno.ESTALE

    def test_handle_of_another_share_is_stale(self, spawn: Any, world: World) -> None:
        a: Agent = spawn(share=world.main)
        b: Agent = spawn(share=world.other)
        htype, from_b = signed(b, "sub/theirs")
        assert open_errno(b, htype, from_b) == 0
        assert open_errno(a, htype, from_b) == errno.ESTALE
        htype, from_a = signed(a, "file")
        assert open_errno(b, htype, from_a) == errno.ESTALE

    def test_handles_are_deterministic_across_targets(self, spawn: Any) -> None:
        a: Agent = spawn()
        b: Agent = spawn()
        assert signed(a, "dir/deep/leaf") == signed(b, "dir/deep/leaf")


class TestEscapes:
    @pytest.mark.parametrize("path,flags,expected", [
        ("../../outside/secret", 0, errno.EACCES),
        ("..", 0, errno.EACCES),
        ("dir/../../other/sub", 0, errno.EACCES),
        ("/etc/passwd", 0, errno.EACCES),
        ("/", 0, errno.EACCES),
        ("link_out", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("link_abs", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("link_out", 0, errno.EOPNOTSUPP),  # the symlink itself: no handles for symlinks
        ("loop_a", AT_SYMLINK_FOLLOW, errno.ELOOP),
        ("/proc/self/root/etc/passwd", 0, errno.ELOOP),
        ("/proc/self/cwd/file", 0, errno.ELOOP),
        ("/proc/1/root/etc", 0, errno.EACCES),  # as for the target: ptrace check
        ("/proc/self/status", 0, errno.EACCES),
        ("fifo", 0, errno.EOPNOTSUPP),
        ("null", 0, errno.EOPNOTSUPP),
        ("fifo", AT_HANDLE_FID, errno.EOPNOTSUPP),
    ])
    def test_lookup_escapes_are_refused(self, target: Agent, path: str, flags: int,
                                        expected: int) -> None:
        assert target.call("n2h", path=path, flags=flags)["errno"] == expected

    def test_proc_fd_magic_link(self, target: Agent) -> None:
        target.call("open", name="etc", path="/etc", flags=O_RDONLY)
        fds = target.call("fdcount")
        assert fds["fds"] > 0
        r = target.call("n2h", path=f"/proc/{target.pid}/fd/3/passwd")
        assert r["errno"] in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR)
        assert target.call("n2h", path="/proc/thread-self/cwd/file")["errno"] == errno.ELOOP

    def test_dirfd_outside_the_share(self, target: Agent) -> None:
        target.call("open", name="etc", path="/etc", flags=O_PATH)
        assert target.call("n2h", dirfd="etc", path="passwd")["errno"] == errno.EACCES
        assert target.call("n2h", dirfd="etc", path="", flags=0x1000)["errno"] == errno.EACCES

    def test_hard_link_to_outside_file_is_inside_by_its_link(self, target: Agent,
                                                               world: World) -> None:
        # Documented outcome: the inode has a name inside the share, so it is the share's.
        htype, handle = signed(target, "hardlink_out")
        r = target.call("obh", handle_type=htype, f_handle=handle.hex())
        assert r["errno"] == 0
        assert bytes.fromhex(r["head"]) == (world.outside / "secret").read_bytes()


@pytest.fixture
def bind_mount(world: World) -> Iterator[Path]:
    point = world.main / "bindmnt"
    point.mkdir()
    point.chmod(0o755)
    subprocess.run(["mount", "--bind", str(world.outside), str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


@pytest.fixture
def tmpfs_inside(world: World) -> Iterator[Path]:
    point = world.main / "tmpfsmnt"
    point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "fhmon-test", str(point)],
                   check=True)
    (point / "f").write_text("on tmpfs\n")
    (point / "f").chmod(0o644)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


class TestMounts:
    def test_bind_mount_inside_share_gives_no_handles(self, bind_mount: Path,
                                                      target: Agent) -> None:
        assert target.call("n2h", path="bindmnt/secret")["errno"] == errno.EOPNOTSUPP
        assert target.call("n2h", path="bindmnt")["errno"] == errno.EOPNOTSUPP

    def test_other_filesystem_inside_share_gives_no_handles(self, tmpfs_inside: Path,
                                                            target: Agent) -> None:
        assert target.call("n2h", path="tmpfsmnt/f")["errno"] == errno.EOPNOTSUPP

    def test_mount_fd_on_another_filesystem_is_stale(self, target: Agent) -> None:
        htype, handle = signed(target, "file")
        target.call("open", name="proc", path="/proc", flags=O_RDONLY)
        assert open_errno(target, htype, handle, mount_fd="proc") == errno.ESTALE


class TestRenames:
    def test_directory_moved_out_of_the_share_is_stale(self, target: Agent,
                                                       world: World) -> None:
        inside = world.main / "movable"
        outside = world.outside / "movable"
        inside.mkdir(mode=0o755)
        try:
            htype, handle = signed(target, "movable")
            assert open_errno(target, htype, handle) == 0
            os.rename(inside, outside)
            assert open_errno(target, htype, handle) == errno.ESTALE
            os.rename(outside, inside)
            assert open_errno(target, htype, handle) == 0
        finally:
            for p in (inside, outside):
                if p.exists():
                    p.rmdir()

    def test_file_moved_out_stays_openable_by_its_handle(self, target: Agent,
                                                         world: World) -> None:
        # Documented (NFS no_subtree_check): non-directories are trusted on their MAC.
        inside = world.main / "movable_file"
        outside = world.outside / "movable_file"
        inside.write_text("moves\n")
        inside.chmod(0o644)
        try:
            htype, handle = signed(target, "movable_file")
            os.rename(inside, outside)
            assert open_errno(target, htype, handle) == 0
        finally:
            for p in (inside, outside):
                if p.exists():
                    p.unlink()


@pytest.fixture(scope="module")
def mount_root_share(world: World) -> Iterator[Path]:
    point = world.shares / "tmpfs-share"
    point.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "fhmon-share", str(point)],
                   check=True)
    (point / "d").mkdir(mode=0o755)
    (point / "d" / "f").write_text("tmpfs share\n")
    (point / "d" / "f").chmod(0o644)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_share_that_is_a_mount_root(mount_root_share: Path, spawn: Any, fhmon: Service) -> None:
    agent: Agent = spawn(share=mount_root_share)
    htype, handle = signed(agent, "d/f")
    r = agent.call("obh", handle_type=htype, f_handle=handle.hex())
    assert r["errno"] == 0 and bytes.fromhex(r["head"]) == b"tmpfs share\n"
    assert agent.call("n2h", path="..")["errno"] == errno.EACCES
    assert agent.call("n2h", path="/etc/passwd")["errno"] == errno.EACCES
    registered = [t for t in fhmon.status()["targets"] if t["share"] == str(mount_root_share)]
    assert registered
