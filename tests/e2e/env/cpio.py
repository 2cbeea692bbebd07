"""Minimal writer for the cpio "newc" format the Linux kernel unpacks as an initramfs.

Why not the cpio tool: the harness appends a small archive (/init and the workload) to the
cached base archive on every run, and writing it in Python needs no extra package.  The kernel
accepts several archives concatenated; later entries overwrite earlier ones.
"""

from __future__ import annotations

import stat
from typing import BinaryIO


class CpioWriter:
    """Writes newc entries to a binary stream; call trailer() last."""

    def __init__(self, out: BinaryIO, mtime: int = 0) -> None:
        self.out = out
        self.mtime = mtime
        self.ino = 1
        self.pos = 0

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.pos += len(data)

    def _pad(self) -> None:
        self._write(b"\0" * (-self.pos % 4))

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        encoded = name.encode() + b"\0"
        fields = [self.ino, mode, 0, 0, nlink, self.mtime, len(data), 0, 0, rdev[0], rdev[1],
                  len(encoded), 0]
        self.ino += 1
        self._write(b"070701" + b"".join(b"%08X" % f for f in fields))
        self._write(encoded)
        self._pad()
        self._write(data)
        self._pad()

    def directory(self, name: str, perm: int = 0o755) -> None:
        self._entry(name, stat.S_IFDIR | perm, nlink=2)

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def char_device(self, name: str, perm: int, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | perm, rdev=(major, minor))

    def trailer(self) -> None:
        self._entry("TRAILER!!!", 0, nlink=1)
