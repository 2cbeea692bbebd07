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


def test_a_directory_of_20000_keys_is_fingerprinted_without_a_stat_per_file(
        tmp_path: Path) -> None:
    """Issue 37.3: the load refuses more than MAX_KEYS key files unread, but the watcher
    statted all 20,000 each second on the loop that runs the intake. Past the bound the
    fingerprint is the listing's count and the directory's own stat, which still changes
    when a key is added or removed (so the repaired directory is loaded again)."""
    from monitor.signing import MAX_KEYS

    key_dir = _key_dir(tmp_path)
    for n in range(20_000):
        (key_dir / f"{0x10000000 + n:08x}.key").touch()
    before = key_dir_fingerprint(str(key_dir))
    assert len(before) == 1 and before[0][:2] == ("too many", 20_001)
    (key_dir / f"{0x10000000:08x}.key").unlink()
    assert key_dir_fingerprint(str(key_dir)) != before
    for n in range(1, 20_000 - MAX_KEYS + 1):
        (key_dir / f"{0x10000000 + n:08x}.key").unlink()
    within = key_dir_fingerprint(str(key_dir))
    assert len(within) == MAX_KEYS + 1  # MAX_KEYS keys and signing-key-id, each statted


def test_files_a_load_does_not_read_do_not_trigger_a_reload(tmp_path: Path) -> None:
    """A writer's temporary file (`.X.key.tmp`) is not a key: no load until the rename."""
    key_dir = _key_dir(tmp_path)
    loader = Loader(key_dir)
    (key_dir / ".00000002.key.tmp").write_text("11" * 32 + "\n")
    trio.run(_watch_for, loader, 3.5, clock=trio.testing.MockClock(autojump_threshold=0))
    assert loader.loads == 0
