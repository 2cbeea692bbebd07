"""The O_PATH fallback, differentially against the kernel's own answers.

ADDFD cannot carry O_PATH files, so fhmon answers an O_PATH open_by_handle_at with a real
open. Where the target may not read its own inode, fhmon may open it readable itself only
when the target's own chmod(2) would succeed right now: the target could then give itself
read access anyway. Each case asks the kernel, as the same uid 65534, for its open(2)
O_RDONLY and its chmod(2), and fhmon's answer must grant read only if one of them would.
The cases: a writable ext4 directory (the control), a read-only bind mount, a read-only
superblock (tmpfs remounted ro), immutable and append-only inodes, a file the target does
not own; each for a mode-000 file and an execute-only (0311) directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import O_DIRECTORY, O_PATH, O_RDONLY, PRIVILEGE, errname, obh, signed
from tests.adversarial.recording import Recorder
from tests.support import NOBODY, Agent, World
from tests.support.mounts import mounted


def populate(where: Path) -> None:
    """A mode-000 file and a 0311 directory, both the target's, and a root-owned 000 file."""
    (where / "mine000").write_text("the target's own mode-000 file\n")
    os.chown(where / "mine000", NOBODY, NOBODY)
    (where / "xdir").mkdir()
    os.chown(where / "xdir", NOBODY, NOBODY)
    (where / "theirs000").write_text("root's mode-000 file\n")


def lock_modes(where: Path) -> None:
    (where / "mine000").chmod(0)
    (where / "xdir").chmod(0o311)
    (where / "theirs000").chmod(0)


@pytest.fixture
def rw_share(world: World) -> Iterator[Path]:
    share = world.shares / "adv-opath-rw"
    share.mkdir(mode=0o755)
    populate(share)
    try:
        yield share
    finally:
        for name in ("mine000", "xdir"):
            subprocess.run(["chattr", "-i", "-a", str(share / name)], check=False)
        shutil.rmtree(share)


@pytest.fixture
def ro_bind_share(world: World) -> Iterator[Path]:
    source = world.base / "adv-opath-rosrc"
    source.mkdir(mode=0o755)
    populate(source)
    lock_modes(source)
    try:
        with mounted(world.shares / "adv-opath-robind", "--bind", str(source)) as point:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(point)], check=True)
            yield point
    finally:
        shutil.rmtree(source)


@pytest.fixture
def ro_super_share(world: World) -> Iterator[Path]:
    with mounted(world.shares / "adv-opath-rosb", "-t", "tmpfs", "-o", "mode=0755",
                 "adv-opath-rosb") as point:
        populate(point)
        lock_modes(point)
        subprocess.run(["mount", "-o", "remount,ro", str(point)], check=True)
        yield point


def differential(record: Recorder, spawn: Any, share: Path, case: str,
                 before_open: Callable[[], None] = lambda: None,
                 after: Callable[[], None] = lambda: None) -> None:
    fh: Agent = spawn(share=share)
    kernel: Agent = spawn("plain", share=share)
    handles = {name: signed(fh, name) for name in ("mine000", "xdir", "theirs000")}
    before_open()
    try:
        for name, what, flags in (("mine000", "its own mode-000 file", O_PATH),
                                  ("xdir", "its own 0311 directory", O_PATH | O_DIRECTORY),
                                  ("theirs000", "root's mode-000 file", O_PATH)):
            mode = os.stat(share / name).st_mode & 0o7777
            own_open = kernel.call("probe_open", path=name,
                                   flags=O_RDONLY | (O_DIRECTORY if name == "xdir" else 0))
            own_chmod = kernel.call("chmod", path=name, mode=mode | 0o400)["errno"]
            if own_chmod == 0:
                with contextlib.suppress(OSError):
                    os.chmod(share / name, mode)  # as it was
            may_read = own_open["errno"] == 0 or own_chmod == 0
            htype, handle = handles[name]
            got = obh(fh, htype, handle, flags=flags)
            readable = got["errno"] == 0 and got.get("accmode") == 0
            record(PRIVILEGE, f"O_PATH fallback, {case}: {what} (kernel: open "
                   f"{errname(own_open['errno'])}, chmod u+r {errname(own_chmod)})",
                   "a readable fd" if may_read else "no readable fd (EACCES)",
                   "a readable fd" if readable else f"no readable fd ({errname(got['errno'])})")
    finally:
        after()


def test_o_path_fallback_on_a_writable_filesystem(rw_share: Path, spawn: Any,
                                                  record: Recorder) -> None:
    differential(record, spawn, rw_share, "writable ext4", lambda: lock_modes(rw_share))


def test_o_path_fallback_on_a_read_only_bind_mount(ro_bind_share: Path, spawn: Any,
                                                   record: Recorder) -> None:
    differential(record, spawn, ro_bind_share, "read-only bind mount")


def test_o_path_fallback_on_a_read_only_superblock(ro_super_share: Path, spawn: Any,
                                                   record: Recorder) -> None:
    differential(record, spawn, ro_super_share, "tmpfs remounted read-only")


@pytest.mark.parametrize("attribute", ["+i", "+a"])
def test_o_path_fallback_on_immutable_and_append_only(rw_share: Path, spawn: Any,
                                                      record: Recorder, attribute: str) -> None:
    def lock() -> None:
        lock_modes(rw_share)
        for name in ("mine000", "xdir"):
            subprocess.run(["chattr", attribute, str(rw_share / name)], check=True)

    def unlock() -> None:
        for name in ("mine000", "xdir"):
            subprocess.run(["chattr", "-" + attribute[1:], str(rw_share / name)], check=True)

    what = {"+i": "immutable", "+a": "append-only"}[attribute]
    differential(record, spawn, rw_share, f"{what} inodes", lock, unlock)
