"""Each target's share of fhmon's fds for its threads' pidfds."""

from __future__ import annotations

import resource

import pytest

from monitor.plane.thread_cache import (
    FDS_PER_TARGET_BESIDES_CACHE,
    MAX_CACHED_THREADS,
    MIN_CACHED_THREADS,
    cached_threads_per_target,
)


@pytest.mark.parametrize(("nofile", "max_targets", "share"), [
    (1_048_576, 4096, 256 - FDS_PER_TARGET_BESIDES_CACHE),  # a common hard limit
    (524_288, 4096, 128 - FDS_PER_TARGET_BESIDES_CACHE),  # systemd's default hard limit
    (20_000, 4096, MIN_CACHED_THREADS),  # less than a cache worth having: the floor
    (1_024, 4096, MIN_CACHED_THREADS),
    (1_048_576, 16, MAX_CACHED_THREADS),  # a few targets: the old fixed limit, no more
    (1_048_576, 0, MAX_CACHED_THREADS),
    (40_000, 1000, 40 - FDS_PER_TARGET_BESIDES_CACHE),
])
def test_a_fair_share_of_the_fd_limit_within_bounds(nofile: int, max_targets: int,
                                                     share: int) -> None:
    assert cached_threads_per_target(max_targets, nofile) == share


def test_the_soft_limit_is_read_when_not_given() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert cached_threads_per_target(64) == cached_threads_per_target(64, soft)
