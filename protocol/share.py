"""What a registration decided about a share, fixed for its lifetime (sans-IO).

One type for these facts wherever they go: monitor.policy.Share holds them beside the fds
that pin the share root (those fds, and their lifetime, belong to Share alone); the worker
protocol (protocol/worker.py) sends them to each worker process as they are; the native
plane takes the subset its checks need (monitor._native.ShareRoot, whose Rust side
native/src/policy.rs ShareFacts mirrors this type; tests/unit/test_share_facts.py holds
the two together).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShareFacts:
    """A pinned share root's identity and place, as monitor/policy.py pin_share found it."""

    # hash of the filesystem's identity and the share root's handle: the key of its MACs
    share_id: bytes
    mount_id: int  # unique mount id (statx) of the share root
    dev: int
    ino: int
    host_path: str  # the allowed host path it matched (for logs and status)
    target_path: str  # the path the target registered it by (in its mount namespace)
    is_mount_root: bool
    # the share root is the root of its mount and that mount shows the filesystem's root:
    # every inode a handle can name on that filesystem is inside the share
    whole_fs: bool = False
