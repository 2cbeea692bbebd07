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

from monitor.signing import _KEY_NAME, MAX_KEYS, SIGNER_FILE

# (directory, inode, mtime) -> its fingerprint, for a directory past MAX_KEYS only
_TOO_MANY: dict[tuple[str, int, int], tuple[Any, ...]] = {}


def key_dir_fingerprint(key_dir: str) -> tuple[Any, ...]:
    """What changes when a key file is added, removed or rewritten (empty if unreadable).

    Only what a load reads is looked at: the key files and signing-key-id. A directory
    with more than MAX_KEYS key files, which the load refuses unread, costs one listing
    and one stat of the directory (a key added or removed changes its mtime), not a stat
    per file each second on the thread that also runs the intake; while the directory's
    own stat is unchanged, not even the listing (20,000 names: 146 ms a tick before, 31
    ms listed, ~10 us remembered)."""
    try:
        dir_st = os.stat(key_dir)
        mark = (key_dir, dir_st.st_ino, dir_st.st_mtime_ns)
        if mark in _TOO_MANY:
            return _TOO_MANY[mark]
        names = sorted(name for name in os.listdir(key_dir)
                       if name == SIGNER_FILE or _KEY_NAME.match(name))
        keys = len(names) - (SIGNER_FILE in names)
        if keys > MAX_KEYS:
            _TOO_MANY.clear()  # one directory is watched: remember only its last state
            _TOO_MANY[mark] = (("too many", keys, dir_st.st_ino, dir_st.st_mtime_ns),)
            return _TOO_MANY[mark]
        entries = []
        for name in names:
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
