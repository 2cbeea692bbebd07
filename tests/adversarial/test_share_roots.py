"""Escapes that depend on what the share's root is: the root of a bind mount of a
subdirectory, the root of a whole filesystem, a subdirectory with paths deeper than PATH_MAX.

"Inside the share" is decided against the share's root on its filesystem, by walking '..'
on fds (monitor/policy.py), never by the mount the share is, nor by a path string:
- a share that is the root of a bind mount of a subdirectory still has a filesystem around
  it: a directory root moves out of it (even into a root-only directory) must no longer
  open by its old handle (ESTALE), and a dirfd held on it must give no handles (EACCES);
- objects deeper than PATH_MAX (which the kernel gives handles for) must get handles and
  open; a directory moved there after its handle was issued still opens.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import (
    AT_EMPTY_PATH,
    ESCAPES,
    O_DIRECTORY,
    O_PATH,
    O_RDONLY,
    errname,
    n2h_errno,
    obh,
    obh_errno,
    signed,
)
from tests.adversarial.recording import Recorder
from tests.support import Agent, Service, World
from tests.support.world import deep_directory


@contextlib.contextmanager
def bind(source: Path, point: Path) -> Iterator[Path]:
    point.mkdir(mode=0o755)
    subprocess.run(["mount", "--bind", str(source), str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()


def make_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def make_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


@pytest.fixture
def bind_share(world: World) -> Iterator[tuple[Path, Path]]:
    """(the share: a bind mount of a subdirectory, the directory around that subdirectory
    with a root-only vault)."""
    around = make_dir(world.base / "adv-bindsrc")
    make_dir(around / "vault", 0o700)
    inner = make_dir(around / "share")
    make_dir(inner / "d")
    make_file(inner / "d" / "f", "moves with d\n")
    try:
        with bind(inner, world.shares / "adv-bindsub") as point:
            yield point, around
    finally:
        shutil.rmtree(around, ignore_errors=True)


def registered_whole_fs(service: Service, share: Path) -> bool | None:
    for event in reversed(service.events()):
        if event.get("event") == "target_registered" and event.get("share") == str(share):
            return bool(event.get("whole_fs"))
    return None


def test_directory_moved_out_of_a_bind_mounted_subdirectory_share(
        bind_share: tuple[Path, Path], spawn: Any, fhmon: Service, record: Recorder) -> None:
    share, around = bind_share
    agent: Agent = spawn(share=share)
    record(ESCAPES, "bind mount of a subdirectory as the share: counted as a whole "
           "filesystem", False, registered_whole_fs(fhmon, share))
    dtype, dir_handle = signed(agent, "d")
    ftype, file_handle = signed(agent, "d/f")
    assert obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY) == 0
    agent.call("open", name="held", path="d", flags=O_PATH)
    os.rename(around / "share" / "d", around / "vault" / "d")
    try:
        for flags, shown in ((O_DIRECTORY, "O_DIRECTORY"), (O_PATH, "O_PATH"),
                             (O_RDONLY, "O_RDONLY")):
            record(ESCAPES, f"bind-subdir share: handle of a directory moved into a 0700 "
                   f"root-only directory outside it, {shown}", errno.ESTALE,
                   obh_errno(agent, dtype, dir_handle, flags=flags))
        record(ESCAPES, "bind-subdir share: dirfd held on a directory since moved out: "
               "lookup 'f'", errno.EACCES, n2h_errno(agent, "f", dirfd="held"))
        record(ESCAPES, "bind-subdir share: dirfd held on a directory since moved out: "
               "AT_EMPTY_PATH", errno.EACCES,
               n2h_errno(agent, "", dirfd="held", flags=AT_EMPTY_PATH))
        agent.call("walk", name="heldf", dirfd="held", parts=["f"])
        record(ESCAPES, "bind-subdir share: O_PATH fd of a file in a directory since moved "
               "out, AT_EMPTY_PATH", errno.EACCES,
               n2h_errno(agent, "", dirfd="heldf", flags=AT_EMPTY_PATH))
        record(ESCAPES, "bind-subdir share: handle of a file whose directory was moved out "
               "(documented: files are trusted on their MAC)", 0,
               obh_errno(agent, ftype, file_handle))
        agent.call("close", name="heldf")
    finally:
        os.rename(around / "vault" / "d", around / "share" / "d")
    record(ESCAPES, "bind-subdir share: the directory's handle once it is back inside", 0,
           obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))


def test_directory_moved_under_the_shares_mountpoint_path(
        bind_share: tuple[Path, Path], spawn: Any, world: World, record: Recorder) -> None:
    """The directory the bind mount covers has the share's own host path: a dentry moved
    into it prints a path "below" the share. Only an fd walk tells it is outside."""
    share, around = bind_share
    agent: Agent = spawn(share=share)
    dtype, dir_handle = signed(agent, "d")
    agent.call("open", name="held", path="d", flags=O_PATH)
    # a plain (not recursive) bind of the whole tree shows what the share's mount covers;
    # rename(2) needs both ends on one mount
    view = Path(f"/tmp/adv-view-{os.getpid()}")
    with bind(world.base, view):
        inner = view / around.name / "share" / "d"
        covered = view / share.relative_to(world.base) / "d"
        os.rename(inner, covered)
        try:
            record(ESCAPES, "bind-subdir share: directory moved into the directory its "
                   "mount covers (its printed path is the share's)", errno.ESTALE,
                   obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))
            record(ESCAPES, "bind-subdir share: dirfd held on it, lookup 'f'", errno.EACCES,
                   n2h_errno(agent, "f", dirfd="held"))
        finally:
            os.rename(covered, inner)


@pytest.fixture
def loop_fs(world: World) -> Iterator[Path]:
    """A loop-mounted ext4 filesystem outside the shares, with sub/d/f in it."""
    image = world.base / "adv-roots.img"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    point = world.base / "adv-roots-fs"
    point.mkdir(mode=0o755)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    try:
        point.chmod(0o755)
        make_dir(point / "sub")
        make_dir(point / "sub" / "d")
        make_file(point / "sub" / "d" / "f", "on the loop filesystem\n")
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()
        image.unlink()


def test_which_shares_cover_their_whole_filesystem(loop_fs: Path, spawn: Any, world: World,
                                                   fhmon: Service, record: Recorder) -> None:
    with bind(loop_fs, world.shares / "adv-fsroot-bind") as whole, \
            bind(loop_fs / "sub", world.shares / "adv-fssub-bind") as sub:
        for share, expected, what in ((whole, True, "a bind mount of a filesystem's root"),
                                      (sub, False, "a bind mount of its subdirectory")):
            agent: Agent = spawn(share=share)
            record(ESCAPES, f"{what} as the share: counted as a whole filesystem", expected,
                   registered_whole_fs(fhmon, share))
            agent.close()
        agent = spawn(share=sub)
        dtype, dir_handle = signed(agent, "d")
        os.rename(loop_fs / "sub" / "d", loop_fs / "d")
        try:
            record(ESCAPES, "bind-subdir share of an ext4 filesystem: a directory moved to "
                   "the filesystem's root, its old handle", errno.ESTALE,
                   obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))
        finally:
            os.rename(loop_fs / "d", loop_fs / "sub" / "d")
        record(ESCAPES, "... moved back: its handle opens", 0,
               obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))


# --- deep paths ----------------------------------------------------------------------------

COMPONENT = "p" * 200
DEPTH = 24  # 24 x 201 bytes: about 4,800, past PATH_MAX


@pytest.fixture
def deep_tree(world: World) -> Iterator[Path]:
    """share/adv_deep/ppp.../ppp.../bottom/{leaf,sub/}, built by mkdirat chains."""
    top = make_dir(world.main / "adv_deep")
    with deep_directory(top, COMPONENT, DEPTH) as fd:
        os.mkdir("bottom", 0o755, dir_fd=fd)
        bottom = os.open("bottom", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=bottom)
        os.write(leaf, b"deep leaf\n")
        os.close(leaf)
        os.mkdir("sub", 0o755, dir_fd=bottom)
        os.close(bottom)
    try:
        yield top
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


DEEP_PARTS = ["adv_deep", *[COMPONENT] * DEPTH, "bottom"]


def deep_rename(old_parts: list[str], old_root: Path, new_parts: list[str],
                new_root: Path) -> None:
    """rename(2) between two paths that may be longer than PATH_MAX (by directory fds)."""
    def parent_fd(root: Path, parts: list[str]) -> int:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd

    src, dst = parent_fd(old_root, old_parts), parent_fd(new_root, new_parts)
    try:
        os.rename(old_parts[-1], new_parts[-1], src_dir_fd=src, dst_dir_fd=dst)
    finally:
        os.close(src)
        os.close(dst)


def test_objects_deeper_than_path_max(deep_tree: Path, spawn: Any, world: World,
                                      fhmon: Service, record: Recorder) -> None:
    failures_before = fhmon.log_text().count("handler failed")
    agent: Agent = spawn()
    kernel: Agent = spawn("plain")
    results: dict[str, tuple[int, int]] = {}
    for who in (agent, kernel):
        who.call("walk", name="bottom", parts=DEEP_PARTS)
        who.call("walk", name="leaf", parts=[*DEEP_PARTS, "leaf"])
    for what, kw in (("the deep directory, AT_EMPTY_PATH",
                      {"path": "", "dirfd": "bottom", "flags": AT_EMPTY_PATH}),
                     ("the deep file, AT_EMPTY_PATH",
                      {"path": "", "dirfd": "leaf", "flags": AT_EMPTY_PATH}),
                     ("the deep file by name from its dirfd", {"path": "leaf", "dirfd": "bottom"}),
                     ("a deep subdirectory by name", {"path": "sub", "dirfd": "bottom"})):
        got = n2h_errno(agent, **kw)
        oracle = n2h_errno(kernel, **kw)
        results[what] = (got, oracle)
        record(ESCAPES, f"path deeper than PATH_MAX: name_to_handle_at of {what}",
               f"success (kernel: {errname(oracle)})", f"{errname(got)} (kernel: "
               f"{errname(oracle)})", ok=got == oracle == 0)
    dtype, dir_handle = signed(agent, "", dirfd="bottom", flags=AT_EMPTY_PATH)
    ftype, file_handle = signed(agent, "", dirfd="leaf", flags=AT_EMPTY_PATH)
    record(ESCAPES, "path deeper than PATH_MAX: open_by_handle_at of the deep directory", 0,
           obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))
    opened = obh(agent, ftype, file_handle)
    record(ESCAPES, "path deeper than PATH_MAX: open_by_handle_at of the deep file reads it",
           "success, deep leaf", f"{errname(opened['errno'])}, "
           f"{bytes.fromhex(opened.get('head', '')).decode().strip()}",
           ok=opened["errno"] == 0 and bytes.fromhex(opened["head"]) == b"deep leaf\n")

    # a directory whose handle was issued near the top, then moved to the bottom
    mover = make_dir(world.main / "adv_mover")
    make_file(mover / "f", "mover\n")
    try:
        mtype, mover_handle = signed(agent, "adv_mover")
        deep_rename(["adv_mover"], world.main, [*DEEP_PARTS, "adv_mover"], world.main)
        record(ESCAPES, "a directory moved deeper than PATH_MAX after its handle was "
               "issued: open_by_handle_at", 0,
               obh_errno(agent, mtype, mover_handle, flags=O_DIRECTORY))
        agent.call("walk", name="moved", parts=[*DEEP_PARTS, "adv_mover"])
        record(ESCAPES, "a directory moved deeper than PATH_MAX: lookup 'f' in it", 0,
               n2h_errno(agent, "f", dirfd="moved"))
        # and out of the share, deep as it is
        deep_rename([*DEEP_PARTS, "adv_mover"], world.main, ["adv_mover"], world.outside)
        record(ESCAPES, "that directory then moved out of the share: open_by_handle_at",
               errno.ESTALE, obh_errno(agent, mtype, mover_handle, flags=O_DIRECTORY))
        record(ESCAPES, "that directory moved out: lookup 'f' from a dirfd held on it",
               errno.EACCES, n2h_errno(agent, "f", dirfd="moved"))
    finally:
        shutil.rmtree(mover, ignore_errors=True)
        shutil.rmtree(world.outside / "adv_mover", ignore_errors=True)
    # the whole deep subtree moved out of the share
    os.rename(deep_tree, world.outside / "adv_deep")
    try:
        record(ESCAPES, "a deep directory whose subtree was moved out of the share",
               errno.ESTALE, obh_errno(agent, dtype, dir_handle, flags=O_DIRECTORY))
        record(ESCAPES, "a deep file whose subtree was moved out: AT_EMPTY_PATH on a held fd",
               errno.EACCES, n2h_errno(agent, "", dirfd="leaf", flags=AT_EMPTY_PATH))
    finally:
        os.rename(world.outside / "adv_deep", deep_tree)
    for who in (agent, kernel):
        for name in ("bottom", "leaf"):
            who.call("close", name=name)
    with contextlib.suppress(Exception):
        agent.call("close", name="moved")
    failures = fhmon.log_text().count("handler failed") - failures_before
    record(ESCAPES, "paths deeper than PATH_MAX: handler failures (EIO, a traceback) in "
           "fhmon's log", "none", "none" if failures == 0 else f"{failures}")
