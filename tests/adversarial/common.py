"""Shared helpers of the adversarial suite: categories, errno names, handle shorthands."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support import NOBODY, Agent
from tests.support.handles import N2HResult

FORGERY = "Forgery"
ESCAPES = "Escapes"
PRIVILEGE = "Privilege"
TOCTOU = "TOCTOU"
REGISTRATION = "Registration abuse"
EXHAUSTION = "Exhaustion and fairness"
FUZZING = "Fuzzing"
CATEGORIES = (FORGERY, ESCAPES, PRIVILEGE, TOCTOU, REGISTRATION, EXHAUSTION, FUZZING)

O_RDONLY, O_WRONLY, O_RDWR = 0, 1, 2
O_CREAT, O_TRUNC, O_APPEND, O_NONBLOCK = 0o100, 0o1000, 0o2000, 0o4000
O_DIRECTORY, O_NOFOLLOW, O_NOATIME = 0o200000, 0o400000, 0o1000000
O_CLOEXEC, O_PATH = 0o2000000, 0o10000000
AT_SYMLINK_FOLLOW, AT_EMPTY_PATH, AT_HANDLE_FID = 0x400, 0x1000, 0x200
TRAILER = 20


def errname(value: int) -> str:
    """0 -> "success", else the errno's symbolic name."""
    if value == 0:
        return "success"
    if value == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"  # == ENOTSUP on Linux; the man pages and docs say EOPNOTSUPP
    return errno.errorcode.get(value, str(value))


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0,
             interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def signed(agent: Agent, path: str, **kw: Any) -> tuple[int, bytes]:
    """(handle_type, f_handle) of a successful name_to_handle_at."""
    r = N2HResult.of(agent.call("n2h", path=path, **kw))
    assert r.errno == 0, r
    return int(r.handle_type or 0), r.f_handle


def warm(agent: Agent) -> None:
    """One lookup and one open by handle (dirfd, cwd and mount_fd paths): fhmon caches a
    pidfd per calling thread, which must exist before a scenario's fd baseline is taken."""
    htype, handle = signed(agent, "file")
    assert obh_errno(agent, htype, handle) == 0


def n2h_errno(agent: Agent, path: str, **kw: Any) -> int:
    return int(agent.call("n2h", path=path, **kw)["errno"])


def obh(agent: Agent, htype: int, f_handle: bytes, **kw: Any) -> dict[str, Any]:
    return agent.call("obh", handle_type=htype, f_handle=f_handle.hex(), **kw)


def obh_errno(agent: Agent, htype: int, f_handle: bytes, **kw: Any) -> int:
    return int(obh(agent, htype, f_handle, **kw)["errno"])


@contextlib.contextmanager
def private_file(path: Path, content: bytes, mode: int = 0o644,
                 owner: int = 0) -> Iterator[Path]:
    """A file of this test only (the session's world is shared by every test)."""
    path.write_bytes(content)
    os.chown(path, owner, owner)
    path.chmod(mode)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def run_as_nobody() -> dict[str, Any]:
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
