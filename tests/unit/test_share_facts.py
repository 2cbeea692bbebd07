"""protocol/share.py ShareFacts is the one type of a share's facts: the native plane's
ShareRoot (native/src/py/boundary.rs, its facts native/src/policy.rs ShareFacts) mirrors it,
and must not drift from it silently."""

from __future__ import annotations

import dataclasses
import inspect

from monitor import _native
from monitor.dataplane import native_share_root
from monitor.policy import Share
from protocol.share import ShareFacts

# the share root's fds: Share's (it owns them), borrowed by ShareRoot, never facts
FDS = {"dir_fd", "path_fd"}


def test_the_native_share_root_takes_share_facts_only() -> None:
    """Every keyword of ShareRoot but the fds is a field of ShareFacts, and
    native_share_root hands each over as it is."""
    taken = set(inspect.signature(_native.ShareRoot).parameters)
    assert taken >= FDS
    facts_taken = taken - FDS
    assert facts_taken <= {field.name for field in dataclasses.fields(ShareFacts)}
    facts = ShareFacts(bytes(range(32)), 2**40 + 7, 2049, 12, "/srv/a", "/a",
                       is_mount_root=True, whole_fs=True)
    root = native_share_root(Share(facts, path_fd=12, dir_fd=11))  # fds borrowed, not used
    assert {name: getattr(root, name) for name in facts_taken} == {
        name: getattr(facts, name) for name in facts_taken}
    assert (root.dir_fd, root.path_fd) == (11, 12)
