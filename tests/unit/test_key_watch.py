"""The key watcher compares the directory with what it was at the last load, not the last tick.

A real directory and the real fingerprint; only time is virtual (trio's MockClock), so that
"within one tick" is exact rather than a race with a loaded machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from monitor.key_watch import key_dir_fingerprint, watch_key_dir


class Loader:
    """Stands for Service.reload_keys: records the fingerprint before each load."""

    def __init__(self, key_dir: Path) -> None:
        self.key_dir = key_dir
        self.loaded_from: tuple[Any, ...] = key_dir_fingerprint(str(key_dir))
        self.loads = 0

    def reload(self) -> None:
        self.loaded_from = key_dir_fingerprint(str(self.key_dir))
        self.loads += 1


async def _watch_for(loader: Loader, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await watch_key_dir(str(loader.key_dir), loader.reload, lambda: loader.loaded_from)


def _key_dir(tmp_path: Path) -> Path:
    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    (key_dir / "00000001.key").write_text("00" * 32 + "\n")
    (key_dir / "signing-key-id").write_text("00000001\n")
    return key_dir


def test_an_unchanged_directory_is_not_reloaded(tmp_path: Path) -> None:
    loader = Loader(_key_dir(tmp_path))
    trio.run(_watch_for, loader, 10.5, clock=trio.testing.MockClock(autojump_threshold=0))
    assert loader.loads == 0


def test_a_change_is_reloaded_once(tmp_path: Path) -> None:
    key_dir = _key_dir(tmp_path)
    loader = Loader(key_dir)
    (key_dir / "00000002.key").write_text("11" * 32 + "\n")
    trio.run(_watch_for, loader, 10.5, clock=trio.testing.MockClock(autojump_threshold=0))
    assert loader.loads == 1


def test_a_sighup_load_of_a_broken_directory_repaired_within_a_tick_is_reloaded(
        tmp_path: Path) -> None:
    """The failure seen under load: keys added, SIGHUP (the load fails: too many), keys
    removed, all between two ticks. The directory is back as the watcher last saw it, but
    the last load read the broken one, so the watcher must load again."""
    key_dir = _key_dir(tmp_path)
    loader = Loader(key_dir)
    extra = key_dir / "00000002.key"
    extra.write_text("11" * 32 + "\n")
    loader.reload()  # the SIGHUP, between two ticks
    extra.unlink()
    trio.run(_watch_for, loader, 1.5, clock=trio.testing.MockClock(autojump_threshold=0))
    assert loader.loads == 2
    assert loader.loaded_from == key_dir_fingerprint(str(key_dir))
