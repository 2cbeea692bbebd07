"""The typed values that cross between Python and the native plane (native/src/py/boundary.rs)."""

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


def plane_config(**changed: Any) -> _native.PlaneConfig:
    from monitor.metrics import LATENCY_BUCKETS

    fields: dict[str, Any] = {"accepted_flags": 0x1200, "signing": True,
                              "threads_per_target": 2, "auto_threads": True,
                              "buckets": list(LATENCY_BUCKETS), "pidfds_per_target": 64}
    untyped: Any = _native.PlaneConfig
    return untyped(**(fields | changed))  # type: ignore[no-any-return]


def test_a_plane_config_keeps_every_field() -> None:
    from monitor.metrics import LATENCY_BUCKETS

    config = plane_config()
    assert (config.accepted_flags, config.signing, config.threads_per_target,
            config.auto_threads, config.buckets, config.pidfds_per_target) == (
        0x1200, True, 2, True, list(LATENCY_BUCKETS), 64)
    with pytest.raises(AttributeError):
        setattr(config, "signing", False)  # noqa: B010 (the assignment must fail at run time)


def test_a_plane_config_needs_every_latency_bucket() -> None:
    with pytest.raises(ValueError, match="latency buckets expected"):
        plane_config(buckets=[0.001, 0.01])


def test_a_plane_config_takes_named_fields_only() -> None:
    untyped: Any = _native.PlaneConfig
    with pytest.raises(TypeError):
        untyped(0x1200, True, 2, True, [0.001] * 12)


def test_a_fresh_plane_has_no_refusal_to_hand_over() -> None:
    from tests.support.plane_target import in_process_plane

    with in_process_plane(1) as plane:
        events, dropped = plane.drain_events()
    assert (events, dropped) == ([], 0)
