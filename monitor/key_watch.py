"""Watching the key directory: a Kubernetes Secret update swaps a symlink, so fhmon
compares the directory's names, inodes, mtimes and sizes once a second with what they were
at the last load (the watcher's own or a SIGHUP's, failed or not) and loads again when they
differ (inotify would miss a change made through the swapped link). Comparing with the last
load rather than the last tick is what recovers a SIGHUP that found the directory broken
and a repair that restored it within one tick: the directory is then as the watcher last
saw it, but not as it was when the failed load read it."""

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
                        loaded_from: Callable[[], tuple[Any, ...]],
                        interval: float = 1.0) -> None:
    """Call reload() whenever the key directory's fingerprint differs from loaded_from(),
    the fingerprint taken just before the last load began (until cancelled)."""
    while True:
        await trio.sleep(interval)
        if key_dir_fingerprint(key_dir) != loaded_from():
            reload()
