"""Watching the key directory: a Kubernetes Secret update swaps a symlink, so fhmon
compares the directory's names, inodes, mtimes and sizes once a second and reloads the
ring when they change (inotify would miss a change made through the swapped link)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio


def key_dir_fingerprint(key_dir: str) -> tuple[Any, ...]:
    """What changes when a key file is added, removed or rewritten (empty if unreadable)."""
    try:
        entries = []
        for name in sorted(os.listdir(key_dir)):
            st = os.stat(os.path.join(key_dir, name))
            entries.append((name, st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(entries)
    except OSError:
        return ()


async def watch_key_dir(key_dir: str, reload: Callable[[], object],
                        interval: float = 1.0) -> None:
    """Call reload() whenever the key directory's fingerprint changes (until cancelled)."""
    last = key_dir_fingerprint(key_dir)
    while True:
        await trio.sleep(interval)
        now = key_dir_fingerprint(key_dir)
        if now != last:
            last = now
            reload()
