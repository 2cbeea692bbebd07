"""Host-side expectation for the guest workload (tests/e2e/guest/workload.sh).

Why a model: the guest only sees the share through virtiofsd (and, in the fhmon runs, through
handles made and opened by fhmon).  After the VM has powered off the host compares the share,
read directly, with a model of what the workload must have left (names, kinds, modes, link
counts, contents, symlink targets), and compares the guest's own final manifest (taken after
drop_caches) with the same manifest computed on the host.  Keep this file in step with the
workload script.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

SUB_FILES = 4
BIG_FILES = 2
TREE_DIRS = 10


@dataclass(eq=False)
class Inode:
    """One expected inode; hard links are several paths naming the same Inode object."""

    kind: str  # "file", "dir" or "symlink"
    mode: int
    content: bytes = b""
    target: str = ""


@dataclass
class Tree:
    """Expected share contents: relative path (no "./") -> inode."""

    paths: dict[str, Inode] = field(default_factory=dict)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self.paths[path] = Inode("dir", mode)

    def write(self, path: str, content: bytes, mode: int = 0o644) -> None:
        self.paths[path] = Inode("file", mode, content)

    def append(self, path: str, content: bytes) -> None:
        self.paths[path].content += content

    def rename(self, old: str, new: str) -> None:
        """rename(2): moves a whole subtree for directories, replaces an existing file."""
        moved = {p: i for p, i in self.paths.items() if p == old or p.startswith(old + "/")}
        for p in moved:
            del self.paths[p]
        for p, i in moved.items():
            self.paths[new + p[len(old):]] = i

    def link(self, old: str, new: str) -> None:
        self.paths[new] = self.paths[old]

    def symlink(self, target: str, path: str) -> None:
        self.paths[path] = Inode("symlink", 0o777, target=target)

    def remove(self, path: str) -> None:
        """unlink(2) or rm -r."""
        for p in [p for p in self.paths if p == path or p.startswith(path + "/")]:
            del self.paths[p]

    def nlink(self, path: str) -> int:
        """Link count as ext4 reports it: directories 2 + subdirectories."""
        inode = self.paths[path]
        if inode.kind == "dir":
            prefix = path + "/"
            children = [p[len(prefix):] for p, i in self.paths.items()
                        if i.kind == "dir" and p.startswith(prefix)]
            return 2 + sum(1 for c in children if "/" not in c)
        return sum(1 for i in self.paths.values() if i is inode)


def gen(rel: str, d: int, f: int) -> bytes:
    """Initial contents of a data file (workload.sh: gen)."""
    n = (d * 7 + f * 3) % 13 + 1
    return "".join(f"fhmon-e2e {rel} line {i}\n" for i in range(1, n + 1)).encode()


def big(b: int) -> bytes:
    """Contents of big/bN (workload.sh: yes LINE | head -c SIZE)."""
    line = f"fhmon-e2e big {b} 0123456789abcdefghijklmnopqrstuvwxyz\n".encode()
    size = 131072 * (b + 1)
    return (line * (size // len(line) + 1))[:size]


def expected_tree(dirs: int, files: int) -> Tree:
    """Replays the workload's steps on the model, in the same order."""
    if dirs < 4 or files < 16:
        raise ValueError("the workload needs at least 4 dirs and 16 files per dir")
    t = Tree()
    # create
    for top in ("data", "big", "links", "sym", "tree"):
        t.mkdir(top)
    for d in range(dirs):
        t.mkdir(f"data/d{d}")
        t.mkdir(f"data/d{d}/sub")
        for f in range(files):
            t.write(f"data/d{d}/f{f}", gen(f"data/d{d}/f{f}", d, f))
        for s in range(SUB_FILES):
            t.write(f"data/d{d}/sub/s{s}", gen(f"data/d{d}/sub/s{s}", d, s + 100))
    for b in range(BIG_FILES):
        t.write(f"big/b{b}", big(b))
    # append
    for d in range(dirs):
        for f in range(files):
            t.append(f"data/d{d}/f{f}", f"append data/d{d}/f{f}\n".encode())
    # rename
    for d in range(dirs):
        nxt = (d + 1) % dirs
        t.rename(f"data/d{d}/f0", f"data/d{d}/g0")
        t.rename(f"data/d{d}/f1", f"data/d{d}/g1")
        t.rename(f"data/d{d}/f2", f"data/d{nxt}/x{d}")
        t.rename(f"data/d{d}/f3", f"data/d{d}/f4")
        if d % 2 == 0:
            t.rename(f"data/d{d}/sub", f"data/d{d}/sub_r")
    t.rename("data/d1/sub", "data/d0/moved")
    # hardlink
    for d in range(dirs):
        t.link(f"data/d{d}/f5", f"links/h{d}")
        t.link(f"data/d{d}/f5", f"data/d{d}/f5.b")
        t.append(f"links/h{d}", f"via link {d}\n".encode())
        t.remove(f"data/d{d}/f5.b")
    # symlink
    for d in range(dirs):
        t.symlink(f"../data/d{d}/f6", f"sym/l{d}")
    t.symlink("does-not-exist", "sym/dangling")
    t.symlink("../data/d0", "sym/dir0")
    t.symlink("/etc/passwd", "sym/abs")
    # chmod
    for d in range(dirs):
        t.paths[f"data/d{d}/f7"].mode = 0o600
        t.paths[f"data/d{d}/f8"].mode = 0o755
        t.paths[f"data/d{d}/f9"].mode = 0o444
    t.paths[f"data/d{dirs - 1}"].mode = 0o700
    t.paths[f"data/d{dirs - 2}"].mode = 0o750
    # unlink / rmdir
    for d in range(dirs):
        t.remove(f"data/d{d}/f10")
        t.remove(f"data/d{d}/f11")
    for i in range(TREE_DIRS):
        if i % 2:
            t.mkdir(f"tree/a{i}")
    return t


def _kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return f"other({stat.S_IFMT(st.st_mode):o})"


def walk(share: Path) -> dict[str, os.stat_result]:
    """Every entry under share (not share itself), by relative path, never following symlinks."""
    out: dict[str, os.stat_result] = {}
    for dirpath, dirnames, filenames in os.walk(share, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(share))] = p.lstat()
    return out


def check_share(share: Path, dirs: int, files: int, *, limit: int = 40) -> list[str]:
    """Differences between the share as the host sees it and the model; empty when all is right."""
    want = expected_tree(dirs, files)
    have = walk(share)
    problems: list[str] = []
    for p in sorted(set(want.paths) - set(have)):
        problems.append(f"missing: {p}")
    for p in sorted(set(have) - set(want.paths)):
        problems.append(f"unexpected: {p}")
    for p in sorted(set(want.paths) & set(have)):
        w, st = want.paths[p], have[p]
        if _kind(st) != w.kind:
            problems.append(f"{p}: kind {_kind(st)}, want {w.kind}")
            continue
        if w.kind != "symlink" and stat.S_IMODE(st.st_mode) != w.mode:
            problems.append(f"{p}: mode {stat.S_IMODE(st.st_mode):o}, want {w.mode:o}")
        if st.st_nlink != want.nlink(p):
            problems.append(f"{p}: nlink {st.st_nlink}, want {want.nlink(p)}")
        if w.kind == "file" and (share / p).read_bytes() != w.content:
            problems.append(f"{p}: contents differ ({st.st_size} bytes, want {len(w.content)})")
        if w.kind == "symlink" and os.readlink(share / p) != w.target:
            problems.append(f"{p}: target {os.readlink(share / p)!r}, want {w.target!r}")
    return problems[:limit]


def _busybox_type(st: os.stat_result) -> str:
    """%F as busybox stat prints it."""
    if stat.S_ISREG(st.st_mode):
        return "regular file" if st.st_size else "regular empty file"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link"
    return "other"


def host_manifest(share: Path) -> list[str]:
    """The manifest the guest prints (workload.sh: manifest), computed from the host's view."""
    entries = {".": share.lstat()}
    entries.update({f"./{p}": st for p, st in walk(share).items()})
    names = sorted(entries)
    lines = []
    for n in names:
        st = entries[n]
        mode = stat.S_IMODE(st.st_mode)
        lines.append(f"S {n}|{_busybox_type(st)}|{mode:o}|{st.st_nlink}|{st.st_size}")
    for n in names:
        if stat.S_ISREG(entries[n].st_mode):
            digest = hashlib.sha256((share / n).read_bytes()).hexdigest()
            lines.append(f"H {digest}  {n}")
    for n in names:
        if stat.S_ISLNK(entries[n].st_mode):
            lines.append(f"L {n}|{os.readlink(share / n)}")
    return lines


def check_guest_manifest(share: Path, guest: list[str], *, limit: int = 40) -> list[str]:
    """Differences between what the guest saw after drop_caches and what the host sees."""
    host = host_manifest(share)
    if guest == host:
        return []
    diff = difflib.unified_diff(host, guest, "host", "guest", lineterm="", n=0)
    return list(diff)[:limit]


def expected_counts(dirs: int, files: int) -> dict[str, int]:
    """What the guest's find must count (the share itself included, as find . does)."""
    t = expected_tree(dirs, files)
    kinds = [i.kind for i in t.paths.values()]
    return {
        "entries": len(t.paths) + 1,
        "nfiles": kinds.count("file"),
        "ndirs": kinds.count("dir") + 1,
        "nlinks": kinds.count("symlink"),
    }
