"""What fhmon remembers about a target between calls must never outlive what it names.

- A pidfd (and frozen credentials) per target thread: a new thread that reuses a cached
  TID must be served as itself, not through the dead thread's entry.
- The last mount_fd of open_by_handle_at: a new file under the same fd number must be
  judged afresh.

The kernel hands out TIDs in order; root picks the next one through ns_last_pid, so the
test makes the reuse happen instead of waiting for it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Agent, wait_until
from tests.handles import N2HResult

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
AT_EMPTY_PATH = 0x1000


def call_on_reused_tid(agent: Agent, call: dict[str, Any]) -> tuple[dict[str, Any],
                                                                    dict[str, Any]]:
    """The call on a thread, then again on a new thread with the first one's TID."""
    first = agent.call("thread_call", call=call, answer_within=30)
    tid = first["tid"]
    assert wait_until(lambda: not os.path.exists(f"/proc/{agent.pid}/task/{tid}"))
    for _ in range(50):  # another process may take the TID first: try again
        NS_LAST_PID.write_text(str(tid - 1))
        second = agent.call("thread_call", call=call, answer_within=30)
        if second["tid"] == tid:
            return first, second
    pytest.fail(f"no new thread got TID {tid}")


@pytest.mark.parametrize("call", [
    pytest.param({"op": "n2h", "dirfd": "share", "path": "", "flags": AT_EMPTY_PATH},
                 id="n2h-dirfd"),
    pytest.param({"op": "n2h", "path": "dir/inner"}, id="n2h-cwd-path"),
])
def test_name_to_handle_at_from_a_thread_reusing_a_cached_tid(spawn: Any,
                                                              call: dict[str, Any]) -> None:
    agent: Agent = spawn()
    first, second = call_on_reused_tid(agent, call)
    one, two = N2HResult.of(first), N2HResult.of(second)
    assert (one.errno, two.errno) == (0, 0)
    assert (two.handle_type, two.f_handle) == (one.handle_type, one.f_handle)


def test_open_by_handle_at_from_a_thread_reusing_a_cached_tid(spawn: Any) -> None:
    agent: Agent = spawn()
    handle = N2HResult.of(agent.call("n2h", path="file"))
    assert handle.errno == 0
    call = {"op": "obh", "f_handle": handle.f_handle.hex(), "handle_type": handle.handle_type,
            "mount_fd": "share"}
    first, second = call_on_reused_tid(agent, call)
    assert (first["errno"], second["errno"]) == (0, 0)
    assert (second["dev"], second["ino"]) == (first["dev"], first["ino"])


def test_a_new_file_under_a_remembered_mount_fd_number_is_judged_afresh(spawn: Any) -> None:
    agent: Agent = spawn()
    handle = N2HResult.of(agent.call("n2h", path="file"))
    obh = {"f_handle": handle.f_handle.hex(), "handle_type": handle.handle_type}
    first = agent.call("open", path=".", flags=os.O_RDONLY, name="mnt")
    assert first["errno"] == 0
    assert agent.call("obh", mount_fd="mnt", **obh)["errno"] == 0  # now remembered
    agent.call("close", name="mnt")
    # The lowest free number comes back: the same number, other open files.
    for path, flags, expected in [(".", os.O_PATH, errno.EBADF),  # the kernel: O_PATH
                                  ("/proc", os.O_RDONLY, errno.ESTALE),  # another fs
                                  (".", os.O_RDONLY, 0)]:
        opened = agent.call("open", path=path, flags=flags, name="mnt")
        assert (opened["errno"], opened["ret"]) == (0, first["ret"])
        got = agent.call("obh", mount_fd="mnt", answer_within=30, **obh)
        assert got["errno"] == expected, (path, flags, got)
        agent.call("close", name="mnt")
    # and a closed number: EBADF
    assert agent.call("obh", mount_fd=opened["ret"], **obh)["errno"] == errno.EBADF
