"""Escapes: a hostile target tries to get a handle (or an fd) for something outside its share.

Documented answers (docs/semantics.md): a lookup that lands outside the share gives EACCES;
an object on another mount inside the share gives EOPNOTSUPP; magic links give ELOOP; a
directory moved out of a (non mount-root) share gives ESTALE; non-directories are trusted
on their MAC (NFS no_subtree_check), so a file renamed out, or an outside file hard-linked
into the share, still opens: those rows expect success, as documented.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import (
    AT_EMPTY_PATH,
    AT_HANDLE_FID,
    AT_SYMLINK_FOLLOW,
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
from tests.support.handles import N2HResult
from tests.support.mounts import mounted

LINKS = 41  # one more than the kernel's MAXSYMLINKS


@pytest.fixture(scope="module")
def planted(world: World) -> Iterator[Path]:
    """Symlinks an attacker could have planted in the share (the target can write there)."""
    main = world.main
    made: list[Path] = []

    def link(name: str, to: str) -> None:
        os.symlink(to, main / name)
        made.append(main / name)

    link("adv_chain1", "adv_chain2")
    link("adv_chain2", "adv_chain3")
    link("adv_chain3", "../../outside/secret")
    link("adv_outdir", "../../outside")
    link("adv_abs_dir", str(world.outside))
    link("adv_self", "adv_self")
    link("adv_proc_root", "/proc/self/root")
    for i in range(LINKS):
        link(f"adv_long{i}", f"adv_long{i + 1}")
    (main / f"adv_long{LINKS}").write_text("end of a long chain\n")
    (main / f"adv_long{LINKS}").chmod(0o644)
    made.append(main / f"adv_long{LINKS}")
    try:
        yield main
    finally:
        for path in made:
            path.unlink()


@pytest.fixture
def target(spawn: Any, planted: Path) -> Agent:
    agent: Agent = spawn()
    return agent


def lookup_cases(world: World) -> list[tuple[str, int, int]]:
    outside, other, main = world.outside, world.other, world.main
    return [
        ("..", 0, errno.EACCES),
        ("../..", 0, errno.EACCES),
        ("../" * 30 + "etc/passwd", 0, errno.EACCES),
        ("dir/deep/../../../../outside/secret", 0, errno.EACCES),
        ("dir/../../other/sub/theirs", 0, errno.EACCES),
        ("/", 0, errno.EACCES),
        ("/etc/passwd", 0, errno.EACCES),
        (f"{outside}/secret", 0, errno.EACCES),
        (f"{other}/sub/theirs", 0, errno.EACCES),
        ("link_out", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("link_abs", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("link_out", 0, errno.EOPNOTSUPP),  # the symlink itself: no handles for symlinks
        ("adv_chain1", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("adv_outdir/secret", 0, errno.EACCES),
        ("adv_outdir", AT_SYMLINK_FOLLOW, errno.EACCES),
        ("adv_abs_dir/secret", 0, errno.EACCES),
        ("adv_self", AT_SYMLINK_FOLLOW, errno.ELOOP),
        ("loop_a", AT_SYMLINK_FOLLOW, errno.ELOOP),
        ("loop_a/x", 0, errno.ELOOP),
        ("adv_long0", AT_SYMLINK_FOLLOW, errno.ELOOP),
        ("adv_proc_root/etc/passwd", 0, errno.ELOOP),
        ("/proc/self/root/etc/passwd", 0, errno.ELOOP),
        ("/proc/self/cwd/file", 0, errno.ELOOP),
        ("/proc/thread-self/root/etc", 0, errno.ELOOP),
        ("/proc/self/fd/0", AT_SYMLINK_FOLLOW, errno.ELOOP),
        ("/proc/self/status", 0, errno.EACCES),
        ("/proc/1/root/etc", 0, errno.EACCES),  # ptrace check as the target: no rights
        (f"{main}/file", 0, 0),  # control: an absolute path that stays inside is fine
    ]


def test_lookups_that_leave_the_share(target: Agent, world: World, record: Recorder) -> None:
    for path, flags, expected in lookup_cases(world):
        shown = path if len(path) < 60 else path[:24] + "..." + path[-20:]
        follow = " (AT_SYMLINK_FOLLOW)" if flags & AT_SYMLINK_FOLLOW else ""
        record(ESCAPES, f"name_to_handle_at {shown!r}{follow}", expected,
               n2h_errno(target, path, flags=flags))


def test_a_chain_of_41_symlinks_loops_as_in_the_kernel(target: Agent, spawn: Any,
                                                         record: Recorder) -> None:
    kernel: Agent = spawn("plain")
    oracle = kernel.call("whereis", path="adv_long0", follow=True)["errno"]
    got = n2h_errno(target, "adv_long0", flags=AT_SYMLINK_FOLLOW)
    record(ESCAPES, f"a chain of {LINKS} symlinks inside the share", errno.ELOOP,
           f"{errname(got)} (kernel: {errname(oracle)})",
           ok=got == oracle == errno.ELOOP)


def test_magic_links_of_the_target_itself(target: Agent, record: Recorder) -> None:
    pid = target.pid
    etc = target.call("open", name="etc", path="/etc", flags=O_PATH)["ret"]
    share = target.call("open", name="share_dir", path=".", flags=O_PATH)["ret"]
    for path in (f"/proc/{pid}/root/etc/passwd", f"/proc/{pid}/cwd/file",
                 f"/proc/{pid}/fd/{etc}/passwd", f"/proc/{pid}/fd/{share}/file",
                 f"/proc/{pid}/task/{pid}/root/etc"):
        record(ESCAPES, f"magic link {path.replace(str(pid), 'PID')}", errno.ELOOP,
               n2h_errno(target, path))
    target.call("open", name="procself", path="/proc/self", flags=O_PATH | O_DIRECTORY)
    for path, flags in (("root/etc/passwd", 0), ("cwd", AT_SYMLINK_FOLLOW),
                        (f"fd/{etc}", AT_SYMLINK_FOLLOW)):
        record(ESCAPES, f"dirfd = its own /proc/PID, path {path!r}", errno.ELOOP,
               n2h_errno(target, path, dirfd="procself", flags=flags))


def test_dirfds_outside_the_share(target: Agent, record: Recorder) -> None:
    target.call("open", name="etc", path="/etc", flags=O_PATH)
    record(ESCAPES, "dirfd on /etc, path 'passwd'", errno.EACCES,
           n2h_errno(target, "passwd", dirfd="etc"))
    record(ESCAPES, "dirfd on /etc, empty path with AT_EMPTY_PATH", errno.EACCES,
           n2h_errno(target, "", dirfd="etc", flags=AT_EMPTY_PATH))
    record(ESCAPES, "dirfd on the share, path '../../outside/secret'", errno.EACCES,
           n2h_errno(target, "../../outside/secret", dirfd="share"))


# The documented outcomes once more in plain assertions (not rows of the table).

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
def test_lookup_escapes_are_refused(target: Agent, path: str, flags: int,
                                    expected: int) -> None:
    assert target.call("n2h", path=path, flags=flags)["errno"] == expected


def test_proc_fd_magic_link(target: Agent) -> None:
    target.call("open", name="etc", path="/etc", flags=O_RDONLY)
    fds = target.call("fdcount")
    assert fds["fds"] > 0
    r = target.call("n2h", path=f"/proc/{target.pid}/fd/3/passwd")
    assert r["errno"] in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR)
    assert target.call("n2h", path="/proc/thread-self/cwd/file")["errno"] == errno.ELOOP


def test_dirfd_outside_the_share(target: Agent) -> None:
    target.call("open", name="etc", path="/etc", flags=O_PATH)
    assert target.call("n2h", dirfd="etc", path="passwd")["errno"] == errno.EACCES
    assert target.call("n2h", dirfd="etc", path="", flags=0x1000)["errno"] == errno.EACCES


def test_hard_link_to_outside_file_is_inside_by_its_link(target: Agent,
                                                         world: World) -> None:
    # Documented outcome: the inode has a name inside the share, so it is the share's.
    htype, handle = signed(target, "hardlink_out")
    r = target.call("obh", handle_type=htype, f_handle=handle.hex())
    assert r["errno"] == 0
    assert bytes.fromhex(r["head"]) == (world.outside / "secret").read_bytes()


# --- mounts inside the share -----------------------------------------------------------------

def test_mounts_inside_the_share(target: Agent, world: World, record: Recorder) -> None:
    main = world.main
    with contextlib.ExitStack() as stack:
        stack.enter_context(mounted(main / "adv_bind", "--bind", str(world.outside)))
        stack.enter_context(mounted(main / "adv_loop", "--bind", str(world.shares)))
        tmpfs = stack.enter_context(mounted(main / "adv_tmpfs", "-t", "tmpfs", "-o",
                                            "mode=0755", "adv-tmpfs"))
        (tmpfs / "f").write_text("on tmpfs\n")
        (tmpfs / "f").chmod(0o644)
        for path, expected in (("adv_bind", errno.EOPNOTSUPP),
                               ("adv_bind/secret", errno.EOPNOTSUPP),
                               ("adv_loop/other/sub/theirs", errno.EOPNOTSUPP),
                               ("adv_loop/main/file", errno.EOPNOTSUPP),
                               ("adv_tmpfs/f", errno.EOPNOTSUPP),
                               ("adv_bind/..", 0)):
            what = {"adv_bind": "a bind mount of a host dir",
                    "adv_loop": "a bind mount of the shares' parent",
                    "adv_tmpfs": "another filesystem"}[path.split("/")[0]]
            record(ESCAPES, f"{what} inside the share: {path!r}", expected,
                   n2h_errno(target, path))
        htype, handle = signed(target, "file")
        target.call("open", name="bindfd", path="adv_bind", flags=O_RDONLY | O_DIRECTORY)
        opened = obh(target, htype, handle, mount_fd="bindfd")
        record(ESCAPES, "mount_fd on a bind mount of a host dir (same filesystem): still "
               "the share's own file", f"success, {main}/file",
               f"{errname(opened['errno'])}, {opened.get('path')}",
               ok=opened["errno"] == 0 and opened["path"] == f"{main}/file")
        target.call("open", name="procfd", path="/proc", flags=O_RDONLY)
        record(ESCAPES, "mount_fd on another filesystem (/proc)", errno.ESTALE,
               obh_errno(target, htype, handle, mount_fd="procfd"))


@pytest.fixture
def bind_mount(world: World) -> Iterator[Path]:
    with mounted(world.main / "bindmnt", "--bind", str(world.outside)) as point:
        yield point


@pytest.fixture
def tmpfs_inside(world: World) -> Iterator[Path]:
    with mounted(world.main / "tmpfsmnt", "-t", "tmpfs", "-o", "mode=0755",
                 "fhmon-test") as point:
        (point / "f").write_text("on tmpfs\n")
        (point / "f").chmod(0o644)
        yield point


def test_bind_mount_inside_share_gives_no_handles(bind_mount: Path,
                                                  target: Agent) -> None:
    assert target.call("n2h", path="bindmnt/secret")["errno"] == errno.EOPNOTSUPP
    assert target.call("n2h", path="bindmnt")["errno"] == errno.EOPNOTSUPP


def test_other_filesystem_inside_share_gives_no_handles(tmpfs_inside: Path,
                                                        target: Agent) -> None:
    assert target.call("n2h", path="tmpfsmnt/f")["errno"] == errno.EOPNOTSUPP


def test_mount_fd_on_another_filesystem_is_stale(target: Agent) -> None:
    htype, handle = signed(target, "file")
    target.call("open", name="proc", path="/proc", flags=O_RDONLY)
    assert obh_errno(target, htype, handle, mount_fd="proc") == errno.ESTALE


# --- renames and hard links --------------------------------------------------------------------

def test_directory_renamed_out_after_its_handle_was_issued(target: Agent, world: World,
                                                           record: Recorder) -> None:
    inside, outside = world.main / "adv_movable", world.outside / "adv_movable"
    inside.mkdir(mode=0o755)
    (inside / "f").write_text("moves with its dir\n")
    (inside / "f").chmod(0o644)
    try:
        dtype, dir_handle = signed(target, "adv_movable")
        ftype, file_handle = signed(target, "adv_movable/f")
        target.call("open", name="held", path="adv_movable", flags=O_PATH)
        os.rename(inside, outside)
        record(ESCAPES, "handle of a directory renamed out of the share", errno.ESTALE,
               obh_errno(target, dtype, dir_handle, flags=O_DIRECTORY))
        record(ESCAPES, "dirfd held on a directory since renamed out: lookup 'f'",
               errno.EACCES, n2h_errno(target, "f", dirfd="held"))
        record(ESCAPES, "dirfd held on a directory since renamed out: AT_EMPTY_PATH",
               errno.EACCES, n2h_errno(target, "", dirfd="held", flags=AT_EMPTY_PATH))
        record(ESCAPES, "handle of a file whose directory was renamed out (documented: "
               "files are trusted on their MAC, NFS no_subtree_check)", 0,
               obh_errno(target, ftype, file_handle))
        os.rename(outside, inside)
        record(ESCAPES, "the directory's handle once it is back inside", 0,
               obh_errno(target, dtype, dir_handle, flags=O_DIRECTORY))
    finally:
        for path in (inside, outside):
            shutil.rmtree(path, ignore_errors=True)


def test_hard_link_to_a_file_outside(target: Agent, world: World, record: Recorder) -> None:
    htype, handle = signed(target, "hardlink_out")
    opened = obh(target, htype, handle)
    secret = (world.outside / "secret").read_bytes()
    ok = opened["errno"] == 0 and bytes.fromhex(opened["head"]) == secret
    record(ESCAPES, "hard link in the share to a host file outside (documented: the inode "
           "is inside by its link, so it opens)", "success, the linked file's bytes",
           "success, the linked file's bytes" if ok else str(opened), ok=ok)
    link = world.main / "adv_hardlink"
    os.link(world.outside / "secret", link)
    try:
        htype, handle = signed(target, "adv_hardlink")
        link.unlink()
        record(ESCAPES, "handle of a hard link kept after the link is removed from the share "
               "(documented: no_subtree_check)", 0, obh_errno(target, htype, handle))
    finally:
        with contextlib.suppress(FileNotFoundError):
            link.unlink()


def test_directory_moved_out_of_the_share_is_stale(target: Agent,
                                                   world: World) -> None:
    inside = world.main / "movable"
    outside = world.outside / "movable"
    inside.mkdir(mode=0o755)
    try:
        htype, handle = signed(target, "movable")
        assert obh_errno(target, htype, handle) == 0
        os.rename(inside, outside)
        assert obh_errno(target, htype, handle) == errno.ESTALE
        os.rename(outside, inside)
        assert obh_errno(target, htype, handle) == 0
    finally:
        for p in (inside, outside):
            if p.exists():
                p.rmdir()


def test_file_moved_out_stays_openable_by_its_handle(target: Agent,
                                                     world: World) -> None:
    # Documented (NFS no_subtree_check): non-directories are trusted on their MAC.
    inside = world.main / "movable_file"
    outside = world.outside / "movable_file"
    inside.write_text("moves\n")
    inside.chmod(0o644)
    try:
        htype, handle = signed(target, "movable_file")
        os.rename(inside, outside)
        assert obh_errno(target, htype, handle) == 0
    finally:
        for p in (inside, outside):
            if p.exists():
                p.unlink()


# --- a share that is the root of its own filesystem (no path check at all) ---------------------

@pytest.fixture(scope="module")
def mount_root_share(world: World) -> Iterator[Path]:
    point = world.shares / "adv-mountroot"
    with mounted(point, "-t", "tmpfs", "-o", "mode=0755", "adv-mountroot"):
        (point / "d").mkdir(mode=0o755)
        (point / "d" / "f").write_text("mount-root share\n")
        (point / "d" / "f").chmod(0o644)
        os.symlink("/etc", point / "to_etc")
        os.symlink("../main", point / "to_main")
        yield point


def test_escapes_from_a_mount_root_share(mount_root_share: Path, spawn: Any, world: World,
                                         record: Recorder) -> None:
    agent: Agent = spawn(share=mount_root_share)
    root: Agent = spawn("plain", user=None)
    for path, flags, expected in (("..", 0, errno.EACCES), ("../main/file", 0, errno.EACCES),
                                  ("/etc/passwd", 0, errno.EACCES),
                                  ("to_etc", AT_SYMLINK_FOLLOW, errno.EACCES),
                                  ("to_main/file", 0, errno.EACCES),
                                  ("/proc/self/root/etc", 0, errno.ELOOP),
                                  ("d/f", 0, 0)):
        record(ESCAPES, f"mount-root share: name_to_handle_at {path!r}", expected,
               n2h_errno(agent, path, flags=flags))
    raw = N2HResult.of(root.call("n2h", path=str(mount_root_share / "d" / "f")))
    assert raw.errno == 0
    record(ESCAPES, "mount-root share: a raw kernel handle of a file of that filesystem",
           errno.ESTALE, obh_errno(agent, int(raw.handle_type or 0), raw.f_handle))
    record(ESCAPES, "mount-root share: raw kernel handle + 20 zero bytes", errno.ESTALE,
           obh_errno(agent, int(raw.handle_type or 0), raw.f_handle + b"\0" * 20))


def test_share_that_is_a_mount_root(mount_root_share: Path, spawn: Any,
                                    fhmon: Service) -> None:
    agent: Agent = spawn(share=mount_root_share)
    htype, handle = signed(agent, "d/f")
    r = agent.call("obh", handle_type=htype, f_handle=handle.hex())
    assert r["errno"] == 0 and bytes.fromhex(r["head"]) == b"mount-root share\n"
    assert agent.call("n2h", path="..")["errno"] == errno.EACCES
    assert agent.call("n2h", path="/etc/passwd")["errno"] == errno.EACCES
    registered = [t for t in fhmon.status()["targets"] if t["share"] == str(mount_root_share)]
    assert registered
