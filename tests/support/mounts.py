"""Real mounts for tests that need them (root): mounted for the body of a `with`, always
undone (lazily, so a test that still holds an fd there does not leave it behind)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted(point: Path, *args: str) -> Iterator[Path]:
    """`mount ARGS POINT` on a new directory POINT; umount -l and remove it afterwards."""
    point.mkdir(mode=0o755)
    subprocess.run(["mount", *args, str(point)], check=True)
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)
        point.rmdir()
