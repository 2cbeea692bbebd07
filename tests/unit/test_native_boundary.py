"""The typed values that cross between Python and the native plane (native/src/py/share.rs)."""

from __future__ import annotations

from typing import Any

import pytest

from monitor import _native

FIELDS: dict[str, Any] = {"share_id": bytes(range(32)), "dir_fd": 11, "path_fd": 12,
                          "mount_id": 2**40 + 7, "dev": 2049, "ino": 12, "whole_fs": True}


def share_root(share_id: bytes = FIELDS["share_id"]) -> _native.ShareRoot:
    return _native.ShareRoot(share_id=share_id, dir_fd=11, path_fd=12, mount_id=2**40 + 7,
                             dev=2049, ino=12, whole_fs=True)


def test_a_share_root_keeps_every_field() -> None:
    root = share_root()
    assert {name: getattr(root, name) for name in FIELDS} == FIELDS


def test_a_share_root_is_frozen() -> None:
    with pytest.raises(AttributeError):
        setattr(share_root(), "dev", 1)  # noqa: B010 (the assignment must fail at run time)


def test_a_share_root_needs_a_whole_share_id() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        share_root(b"short")


def test_a_share_root_takes_named_fields_only() -> None:
    untyped: Any = _native.ShareRoot
    with pytest.raises(TypeError):
        untyped(*FIELDS.values())


def test_a_fresh_plane_has_counted_nothing() -> None:
    from tests.support.plane_target import in_process_plane

    with in_process_plane(1) as plane:
        stats: _native.PlaneStats = plane.take_stats()
    assert (stats.results, stats.seconds, stats.buckets, stats.refusals, stats.calls,
            stats.panics) == ([], [], [], [], [], 0)
    with pytest.raises(AttributeError):
        setattr(stats, "panics", 1)  # noqa: B010 (the assignment must fail at run time)
