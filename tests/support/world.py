"""The test world: the shared directory tree (shares, an outside area, the agent program),
where fhmon and the agent programs are, and polling helpers for asynchronous clean-up."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOBODY = 65534
SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
FHMON = str(Path(sys.executable).with_name("fhmon"))


def wait_until(predicate: Any, timeout: float = 10.0) -> bool:
    """Poll predicate until true or timeout: fhmon frees resources asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def ready(sources: list[Any], timeout: float) -> list[Any]:
    """Those of sources (fds, or anything with fileno()) that have something to read or
    hung up within timeout seconds. poll(), not select(): select() refuses an fd above
    1,023, and a whole run's pytest process does reach such numbers."""
    poller = select.poll()
    by_fd = {source if isinstance(source, int) else source.fileno(): source
             for source in sources}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(max(0.0, timeout) * 1000)]


def readable(source: Any, timeout: float) -> bool:
    """True once source has something to read or hung up, within timeout seconds."""
    return bool(ready([source], timeout))


@contextlib.contextmanager
def nobodys_directory(path: Path) -> Iterator[Path]:
    """A new directory at path that uid 65534 owns (to write or bind in), removed after."""
    path.mkdir(mode=0o755)
    os.chown(path, NOBODY, NOBODY)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def deep_directory(top: Path, name: str, levels: int) -> Iterator[int]:
    """Makes top/name/name/... (levels directories) and yields an O_DIRECTORY fd of the last.

    For the trees deeper than PATH_MAX that both test_share_roots.py and
    test_differential_planes.py build: no path to their bottom fits in one syscall, so each
    level is made and opened relative to the fd of the one above (mkdirat, openat). The fd is
    closed after the block; what is made stays (the caller removes the tree).
    """
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, 0o755, dir_fd=fd)
            below = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        yield fd
    finally:
        os.close(fd)


LEASE_SYSCTL = Path("/proc/sys/fs/lease-break-time")


@contextlib.contextmanager
def lease_break_time(seconds: int) -> Iterator[None]:
    """The host's lease-break time set to seconds (how long an open waits for a lease
    holder, the blocking call of the lease attacks), restored after."""
    old = LEASE_SYSCTL.read_text()
    LEASE_SYSCTL.write_text(f"{seconds}\n")
    try:
        yield
    finally:
        LEASE_SYSCTL.write_text(old)


def thread_syscalls(pid: int) -> dict[int, list[str]]:
    """Each live thread of pid and its /proc/PID/task/TID/syscall fields: the syscall number
    it is in (or "running"), then its arguments in hex (what a thread sleeps in)."""
    syscalls = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            syscalls[int(tid)] = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
    return syscalls


@dataclass
class World:
    """A directory tree every test shares: shares, an outside area, the agent program."""

    base: Path
    shares: Path
    main: Path  # the main share
    other: Path  # a second share on the same filesystem
    outside: Path  # host files no share contains
    agent: Path


def build_world(base: Path) -> World:
    """The tree under base (a fresh directory): what every test reads and attacks."""
    base.chmod(0o755)
    shares = base / "shares"
    main = shares / "main"
    other = shares / "other"
    outside = base / "outside"
    for d in (shares, main, other, outside, main / "dir", main / "dir" / "deep",
              main / "emptydir", main / "noexec", other / "sub"):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)
    (main / "file").write_text("main file\n")
    (main / "dir" / "inner").write_text("inner file\n")
    (main / "dir" / "deep" / "leaf").write_text("leaf\n")
    (main / "readonly").write_text("read only\n")
    (main / "readonly").chmod(0o444)
    (main / "rootonly").write_text("root secret\n")
    (main / "rootonly").chmod(0o600)
    (main / "writeonly").write_text("write only\n")
    (main / "writeonly").chmod(0o222)
    (main / "nobodys").write_text("owned by nobody\n")
    os.chown(main / "nobodys", NOBODY, NOBODY)
    (main / "noexec" / "hidden").write_text("behind a dir without x\n")
    (main / "noexec").chmod(0o666)
    (other / "sub" / "theirs").write_text("other share\n")
    (outside / "secret").write_text("host secret\n")
    (outside / "secret").chmod(0o644)
    os.symlink("file", main / "link_in")
    os.symlink("dir/inner", main / "link_deep")
    os.symlink("../../outside/secret", main / "link_out")
    os.symlink("/etc/passwd", main / "link_abs")
    os.symlink("loop_b", main / "loop_a")
    os.symlink("loop_a", main / "loop_b")
    os.symlink("dir", main / "link_dir")
    os.mkfifo(main / "fifo")
    os.mknod(main / "null", 0o666 | 0o020000, os.makedev(1, 3))
    os.link(outside / "secret", main / "hardlink_out")
    for p in main.rglob("*"):
        if not p.is_symlink() and p.name not in ("rootonly", "readonly", "writeonly",
                                                   "noexec", "null", "fifo"):
            p.chmod(0o755 if p.is_dir() else 0o644)
    agent = base / "agent.py"
    shutil.copy(SUPPORT / "target_agent.py", agent)
    agent.chmod(0o644)
    return World(base, shares, main, other, outside, agent)
