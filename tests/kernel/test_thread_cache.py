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

from tests.support import Agent, wait_until
from tests.support.handles import N2HResult
from tests.support.pids import SCENARIOS, reuse_number
from tests.support.world import SYSTEM_PYTHON

AT_EMPTY_PATH = 0x1000


def call_on_reused_tid(agent: Agent, call: dict[str, Any]) -> tuple[dict[str, Any],
                                                                    dict[str, Any]]:
    """The call on a thread, then again on a new thread with the first one's TID (if a task
    elsewhere takes that TID and lives on, again with a new first thread)."""
    missed: list[str] = []
    while len(missed) < SCENARIOS:
        first = agent.call("thread_call", call=call, answer_within=30)
        tid = first["tid"]
        task = Path(f"/proc/{agent.pid}/task/{tid}")
        assert wait_until(lambda task=task: not task.exists())
        second = reuse_number(tid, lambda: agent.call("thread_call", call=call,
                                                      answer_within=30),
                              lambda made: made["tid"], lambda made: None, attempts=50)
        if not isinstance(second, str):
            return first, second
        missed.append(second)
    pytest.fail("no new thread got the first one's TID: " + "; ".join(missed))


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


def test_a_full_cache_takes_no_new_entry_and_never_sweeps_on_put(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real pidfds of real threads of this process: with more live threads than the limit,
    put() refuses the extra ones at once, without probing every entry (pidfd_alive on each,
    which made each call of a 2,000-thread target cost ~1,000 syscalls); the periodic
    sweep() makes room once threads exit."""
    import threading

    from monitor import linux
    from monitor.plane.thread_cache import ThreadCache
    from protocol import kernel

    first_end, rest_end = threading.Event(), threading.Event()
    threads = [threading.Thread(target=(first_end if n < 4 else rest_end).wait)
               for n in range(20)]
    for t in threads:
        t.start()
    cache = ThreadCache(limit=8)
    probes: list[int] = []
    cached: list[int] = []
    real_alive = linux.pidfd_alive
    monkeypatch.setattr(linux, "pidfd_alive", lambda fd: probes.append(fd) or real_alive(fd))
    try:
        tids = [t.native_id or 0 for t in threads]
        kept = []
        for tid in tids:
            pidfd = linux.pidfd_open(tid, kernel.PIDFD_THREAD)
            kept.append(cache.put(tid, pidfd, None))
            if kept[-1]:
                cached.append(pidfd)
            else:
                os.close(pidfd)  # the caller's, when not kept
        assert kept == [True] * 8 + [False] * 12
        assert probes == []  # no sweep on put
        assert len(cache) == 8
        fd = cache.take_fd(tids[7], 0)
        assert fd is not None
        os.close(fd)
        first_end.set()  # four cached threads exit
        for t in threads[:4]:
            t.join()
        # join() returns a moment before the kernel's thread is gone
        assert wait_until(lambda: cache.sweep() == 4, timeout=5)
        for tid in tids[8:12]:
            cached.append(linux.pidfd_open(tid, kernel.PIDFD_THREAD))
            assert cache.put(tid, cached[-1], None)
        assert len(cache) == 8
    finally:
        cache.close()
        first_end.set()
        rest_end.set()
        for t in threads:
            t.join()
    for pidfd in cached:  # every pidfd the cache took is closed (swept, or by close())
        with pytest.raises(OSError) as closed:
            os.fstat(pidfd)
        assert closed.value.errno == errno.EBADF


def test_a_target_with_2000_threads_beside_a_neighbour(spawn: Any, world: Any,
                                                       fhmon: Any) -> None:
    """2,000 live threads of one target calling (twice the per-target cache): each of
    them and the neighbour get correct answers, and fhmon holds at most one cache's worth
    of pidfds for them (the latency ratio is in bench/thread_cache.py)."""
    import json
    import time

    crowd: Agent = spawn()
    neighbour: Agent = spawn()
    stop = world.base / "stop-2000-threads"
    baseline = fhmon.fd_count()
    assert crowd.proc.stdin is not None
    crowd.proc.stdin.write(json.dumps({"op": "hammer", "path": "dir/inner", "threads": 2000,
                                       "until": str(stop), "seconds": 120}) + "\n")
    crowd.proc.stdin.flush()
    try:
        assert wait_until(lambda: len(os.listdir(f"/proc/{crowd.pid}/task")) > 2000, 60)
        time.sleep(1)  # all of them calling
        most = 0
        for _ in range(50):
            got = N2HResult.of(neighbour.call("n2h", path="dir/inner", answer_within=10))
            assert got.errno == 0
            most = max(most, fhmon.fd_count())
        assert most <= baseline + 1024 + 32, (baseline, most)
    finally:
        stop.touch()
    out = json.loads(crowd.proc.stdout.readline())  # type: ignore[union-attr]
    assert set(out["results"]) == {"0"}, out  # every call of every thread answered, right
    assert out["ended_by_until"]


@pytest.mark.parametrize("plane", ["native", "python"])
def test_a_many_threaded_target_holds_only_its_share_of_the_fd_limit(
        world: Any, tmp_path: Path, plane: str) -> None:
    """A target with thousands of threads once made fhmon hold 1,024 pidfds for it (the
    cache's fixed limit), so a few such targets reached the fd limit. Each target now gets
    its fair share of RLIMIT_NOFILE (soft limit over max_targets, less its other fds), here
    set to 32 through max_targets; 300 threads calling at once stay within it on both
    planes, every call answered right."""
    import json
    import resource
    import time

    from monitor.plane.thread_cache import FDS_PER_TARGET_BESIDES_CACHE, cached_threads_per_target
    from tests.support import Service

    share = 32
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # fhmon serve raises soft to it
    max_targets = nofile // (share + FDS_PER_TARGET_BESIDES_CACHE)
    assert cached_threads_per_target(max_targets, nofile) == share
    config = tmp_path / "fds.toml"
    config.write_text(f'data_plane = "{plane}"\nmax_targets = {max_targets}\n')
    threads = 300
    with Service(world.base, [str(world.shares / "*")], name=f"fd-share-{plane}",
                 extra=["--config", str(config)]) as service:
        serving = [e for e in service.events() if e.get("event") == "serving"][-1]
        assert serving["pidfds_per_target"] == share
        crowd = Agent(world, "fhmon", world.main, service.socket)
        stop = world.base / f"stop-fd-share-{plane}"
        try:
            baseline = service.fd_count()
            assert crowd.proc.stdin is not None and crowd.proc.stdout is not None
            crowd.proc.stdin.write(json.dumps({"op": "hammer", "path": "dir/inner",
                                               "threads": threads, "until": str(stop),
                                               "seconds": 120}) + "\n")
            crowd.proc.stdin.flush()
            assert wait_until(lambda: len(os.listdir(f"/proc/{crowd.pid}/task")) > threads,
                              60)
            most = 0
            deadline = time.monotonic() + 3  # every thread has called by then, many times
            while time.monotonic() < deadline:
                most = max(most, service.fd_count())
                time.sleep(0.05)
            # the cache's share, and a few fds of calls in flight (a pidfd not kept, a
            # duplicate of the call's fd)
            assert most <= baseline + share + 16, (baseline, most)
        finally:
            stop.touch()
        out = json.loads(crowd.proc.stdout.readline())
        assert set(out["results"]) == {"0"}, out
        assert out["ended_by_until"]
        crowd.close()


def test_a_thread_without_no_new_privs_is_served_as_it_is_after_a_set_user_id_exec(
        spawn: Any, world: Any) -> None:
    """A container without noNewPrivileges: its credentials are cached too, but only until an
    execve of a set-user-ID program, after which fhmon must open as the new euid, exactly
    as the kernel's own open does (the oracle: probe_open in the same process)."""
    import shutil
    import stat

    place = world.main / "nnp-off"
    place.mkdir(mode=0o755)
    try:
        secret = place / "owned-by-1000"
        secret.write_text("only uid 1000 reads this\n")
        os.chown(secret, 1000, 1000)
        secret.chmod(0o400)
        suid_python = world.base / "suid-1000-python"
        shutil.copy(os.path.realpath(SYSTEM_PYTHON), suid_python)
        os.chown(suid_python, 1000, 1000)
        suid_python.chmod(stat.S_ISUID | 0o755)
        agent: Agent = spawn("runc-nnp-off")
        status = Path(f"/proc/{agent.pid}/status").read_text()
        assert "NoNewPrivs:\t0" in status
        handle = N2HResult.of(agent.call("n2h", path="nnp-off/owned-by-1000"))
        assert handle.errno == 0
        obh = {"f_handle": handle.f_handle.hex(), "handle_type": handle.handle_type}
        relative = "nnp-off/owned-by-1000"
        for _ in range(3):  # the second and third from the cache, if any
            assert agent.call("probe_open", path=relative)["errno"] == errno.EACCES
            assert agent.call("obh", **obh, answer_within=30)["errno"] == errno.EACCES
        ready = agent.call("exec", argv=[str(suid_python), str(world.agent), str(world.main)])
        assert ready["ready"] and ready["pid"] == agent.pid
        uids = next(line for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines()
                    if line.startswith("Uid:")).split()[1:]
        assert uids == ["65534", "1000", "1000", "1000"]
        for _ in range(3):
            assert agent.call("probe_open", path=relative)["errno"] == 0
            opened = agent.call("obh", **obh, answer_within=30)
            assert opened["errno"] == 0, opened
    finally:
        shutil.rmtree(place)
        (world.base / "suid-1000-python").unlink(missing_ok=True)
