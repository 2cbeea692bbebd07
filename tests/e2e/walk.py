"""The guest walks a tree of N files (guest/walk.sh) while the host watches virtiofsd's fds.

Why a module of its own: the open-files wall test (test_fd_wall.py) and its benchmark
(bench/inodes.py) need the same pieces -- a tree made on the host, the walk script with its
parameters, a watcher that finds this run's virtiofsd and samples its fds and RSS during the
run and once more when the guest has finished walking (the guest holds its dentries, so
virtiofsd still holds every inode it looked up) -- on top of harness.run_scenario.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import harness

WALK_SCRIPT = harness.GUEST / "walk.sh"
HOLD_LINE = "FHMON-E2E-HOLD"
RELEASE_NAME = ".fhmon-release"
#: virtiofsd 1.13 at its guest fd limit (src/passthrough/guest_fd_limit.rs), logged once.
NO_MORE_FDS = "No more file descriptors available to the guest"


@dataclass(frozen=True)
class Tree:
    """tree/ under a share: `files` empty regular files in `dirs` directories."""

    root: Path
    files: int
    dirs: int
    last: str   # the last file's path relative to the share (the guest stats it by name)
    per_dir: int


def make_tree(share: Path, files: int, per_dir: int = 1000) -> Tree:
    """Creates share/tree with files empty files, per_dir to a directory (root-owned, 0644
    files in 0755 directories: any uid can look them up)."""
    root = share / "tree"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    dirs = 0
    name = ""
    for i in range(files):
        if i % per_dir == 0:
            dirs += 1
            d = root / f"d{dirs - 1:05d}"
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)
        name = f"{d.name}/f{i:07d}"
        os.close(os.open(root / name, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644))
    return Tree(root=root, files=files, dirs=dirs, last=f"tree/{name}", per_dir=per_dir)


def write_walk_script(dest: Path, tree: Tree, hold_seconds: int) -> Path:
    """guest/walk.sh with its parameters (how many files to expect, which one to stat by name,
    how long to wait for the host) in front."""
    body = WALK_SCRIPT.read_text()
    header = (f"WALK_FILES={tree.files}\nWALK_LAST={tree.last}\nWALK_PER_DIR={tree.per_dir}\n"
              f"WALK_HOLD={int(hold_seconds)}\n")
    first, _, rest = body.partition("\n")
    dest.write_text(f"{first}\n{header}{rest}")
    return dest


_RESULT = re.compile(r"FHMON-E2E-RESULT (.*)")
_KV = re.compile(r"(\w+)=(\S*)")


def parse_walk_result(console: str) -> dict[str, str] | None:
    """The key=value pairs of walk.sh's FHMON-E2E-RESULT line (None when there is none)."""
    found = None
    for line in console.splitlines():
        m = _RESULT.search(line.rstrip("\r"))
        if m:
            found = dict(_KV.findall(m.group(1)))
    return found


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def rss_kib(pid: int) -> int | None:
    """VmRSS of pid in KiB (None once it is gone)."""
    value = harness.process_status(pid).get("VmRSS", "")
    return int(value.split()[0]) if value.split() else None


@dataclass
class Watch:
    """Samples this run's virtiofsd every tick (peak fds) and once at the guest's hold line.

    on_hold, when given, runs at that moment too (e.g. to read a cgroup or fhmon's own fds);
    its dict is kept in `at_hold`. Then the release file is created and the guest goes on.
    """

    env: harness.Env
    rd: harness.RunDir
    on_hold: Callable[[int], dict[str, Any]] | None = None
    pid: int | None = None
    peak_fds: int = 0
    at_hold: dict[str, Any] | None = None
    samples: list[tuple[int, int]] = field(default_factory=list)   # (fds, rss KiB)

    def _find_pid(self) -> int | None:
        for pid in harness.pids_mentioning(f"--socket-path={self.rd.socket}"):
            # virtiofsd itself, not a wrapper: its argv[0] is trixie's loader.
            if harness.process_cmdline(pid).startswith(self.env.ld_so + " "):
                return pid
        return None

    def tick(self, _res: harness.RunResult | None = None) -> None:
        if self.pid is None:
            self.pid = self._find_pid()
        if self.pid is None:
            return
        fds, rss = fd_count(self.pid), rss_kib(self.pid)
        if fds is None or rss is None:
            return
        self.peak_fds = max(self.peak_fds, fds)
        self.samples.append((fds, rss))
        if self.at_hold is None and self._guest_holds():
            self.at_hold = {"virtiofsd_fds": fds, "virtiofsd_rss_kib": rss}
            if self.on_hold is not None:
                with contextlib.suppress(OSError, ValueError):
                    self.at_hold.update(self.on_hold(self.pid))
            release = self.rd.share / RELEASE_NAME
            release.touch()
            release.chmod(0o644)

    def _guest_holds(self) -> bool:
        console = self.rd.base / "console.log"
        try:
            return HOLD_LINE in console.read_text(errors="replace")
        except OSError:
            return False


@dataclass
class WalkRun:
    """One walk: the scenario's result, the walk's own figures and what the watch saw."""

    res: harness.RunResult
    walk: dict[str, str] | None
    watch: Watch

    @property
    def passed(self) -> bool:
        return self.walk is not None and self.walk.get("status") == "pass"

    def number(self, key: str) -> int:
        """An integer field of the walk's result line (-1 when it is missing)."""
        try:
            return int((self.walk or {}).get(key, "-1"))
        except ValueError:
            return -1

    def describe(self) -> str:
        return (f"walk={self.walk}\npeak virtiofsd fds={self.watch.peak_fds} "
                f"at_hold={self.watch.at_hold}\n{self.res.summary()}")


def run_walk(env: harness.Env, rd: harness.RunDir, tree: Tree, *, uid: int, mode: str,
             wrapper: Sequence[str] = (), extra_virtiofsd_args: Sequence[str] = (),
             hold_seconds: int = 30, qemu_timeout: float = 600, tick_seconds: float = 0.5,
             on_hold: Callable[[int], dict[str, Any]] | None = None) -> WalkRun:
    """Boots the guest on rd.share (which holds tree) and runs the walk; never raises for a
    failing walk (the caller asserts)."""
    script = write_walk_script(rd.base / "walk.sh", tree, hold_seconds)
    watch = Watch(env=env, rd=rd, on_hold=on_hold)
    res = harness.run_scenario(env, rd, mode=mode, uid=uid, wrapper=wrapper,
                               extra_virtiofsd_args=extra_virtiofsd_args, workload=script,
                               check=False, on_tick=watch.tick, tick_seconds=tick_seconds,
                               qemu_timeout=qemu_timeout)
    return WalkRun(res=res, walk=parse_walk_result(res.console), watch=watch)
