"""Handles of one share presented in another, where the kernel's own bytes are the same.

Every ext4 root is inode 2, generation 0, so a share id made from the root's handle alone
is the same for two shares that are filesystem roots (two PVCs), and each one's handles
verified in the other. The share id now binds the filesystem's identity (its superblock
UUID): real loop-mounted ext4 filesystems, uid 65534 targets under `fhmon launch`.
A clone (a copy of the image: same UUID, same inodes) cannot be told apart from its
original by anything on it; giving the clone a new UUID (tune2fs -U) does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import FORGERY, O_DIRECTORY, obh, obh_errno, signed
from tests.adversarial.recording import Recorder
from tests.support import Agent, World
from tests.support.handles import N2HResult

GENERATION = "4242"  # the same i_generation on both (chattr -v; needs no metadata_csum)


@contextlib.contextmanager
def ext4(image: Path, point: Path, fresh: bool = True) -> Iterator[Path]:
    if fresh:
        with open(image, "wb") as f:
            f.truncate(32 << 20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^metadata_csum", str(image)], check=True)
    point.mkdir(mode=0o755)
    subprocess.run(["mount", "-o", "loop", str(image), str(point)], check=True)
    try:
        yield point
    finally:
        # fhmon lets go of a gone target's share fds asynchronously (a worker process may
        # still hold them): a lazy unmount would leave the superblock alive, and it would
        # write its old UUID back over a tune2fs of the image
        deadline = time.monotonic() + 10
        while subprocess.run(["umount", str(point)], check=False,
                             capture_output=True).returncode:
            if time.monotonic() > deadline:
                subprocess.run(["umount", "-l", str(point)], check=False)
                break
            time.sleep(0.1)
        point.rmdir()


def populate(root: Path, text: str) -> None:
    root.chmod(0o755)
    (root / "d").mkdir(mode=0o755)
    (root / "d" / "f").write_text(text)
    (root / "d" / "f").chmod(0o644)
    for path in (root / "d", root / "d" / "f"):
        subprocess.run(["chattr", "-v", GENERATION, str(path)], check=True)


@pytest.fixture
def two_filesystems(world: World) -> Iterator[tuple[Path, Path]]:
    images = world.base / "adv-images"
    images.mkdir(exist_ok=True)
    with ext4(images / "a.img", world.shares / "adv-ext4-a") as a, \
            ext4(images / "b.img", world.shares / "adv-ext4-b") as b:
        populate(a, "filesystem A\n")
        populate(b, "filesystem B\n")
        yield a, b


def raw_handle(agent: Agent, path: str) -> bytes:
    got = N2HResult.of(agent.call("n2h", path=path))
    assert got.errno == 0, got
    return got.f_handle


def test_handles_of_one_filesystem_root_share_in_another(
        two_filesystems: tuple[Path, Path], spawn: Any, record: Recorder) -> None:
    a_share, b_share = two_filesystems
    a: Agent = spawn(share=a_share)
    b: Agent = spawn(share=b_share)
    root_a: Agent = spawn("plain", share=a_share, user=None)
    root_b: Agent = spawn("plain", share=b_share, user=None)
    for path in (".", "d", "d/f"):  # the premise: the kernel's bytes are the same
        assert raw_handle(root_a, path) == raw_handle(root_b, path), path
    for path, what, flags in ((".", "the filesystem root", O_DIRECTORY),
                              ("d", "a directory (same inode and generation)", O_DIRECTORY),
                              ("d/f", "a file (same inode and generation)", 0)):
        htype, from_a = signed(a, path)
        assert obh_errno(a, htype, from_a, flags=flags) == 0
        opened = obh(b, htype, from_a, flags=flags)
        record(FORGERY, f"two ext4 filesystem-root shares: handle of {what} from one, "
               f"opened in the other (equal kernel bytes)", errno.ESTALE, opened["errno"])
        htype, from_b = signed(b, path)
        record(FORGERY, f"two ext4 filesystem-root shares: the reverse, {what}",
               errno.ESTALE, obh_errno(a, htype, from_b, flags=flags))


def test_a_cloned_volume(world: World, spawn: Any, record: Recorder) -> None:
    images = world.base / "adv-images"
    images.mkdir(exist_ok=True)
    with ext4(images / "orig.img", world.shares / "adv-ext4-orig") as orig:
        populate(orig, "original\n")
        subprocess.run(["umount", str(orig)], check=True)
        subprocess.run(["cp", "--sparse=always", str(images / "orig.img"),
                        str(images / "clone.img")], check=True)
        subprocess.run(["mount", "-o", "loop", str(images / "orig.img"), str(orig)],
                       check=True)
        a: Agent = spawn(share=orig)
        htype, handle = signed(a, "d/f")
        with ext4(images / "clone.img", world.shares / "adv-ext4-clone", fresh=False) as c:
            clone: Agent = spawn(share=c)
            opened = obh(clone, htype, handle)
            record(FORGERY, "a clone of the share's volume (same UUID, same inodes): the "
                   "original's handle (documented: a clone cannot be told apart)",
                   "success, the clone's copy", f"{opened['errno'] or 'success'}, "
                   f"{bytes.fromhex(opened.get('head', '')).decode().strip()}",
                   ok=opened["errno"] == 0)
            clone.close()
        subprocess.run(["e2fsck", "-fy", str(images / "clone.img")], check=False,
                       capture_output=True)
        subprocess.run(["tune2fs", "-U", "random", str(images / "clone.img")],
                       check=True, capture_output=True)
        with ext4(images / "clone.img", world.shares / "adv-ext4-clone", fresh=False) as c:
            clone = spawn(share=c)
            record(FORGERY, "that clone after `tune2fs -U random`: the original's handle",
                   errno.ESTALE, obh_errno(clone, htype, handle))
            clone.close()
        a.close()
    for name in ("orig.img", "clone.img"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(images / name)
