"""name_to_handle_at through fhmon vs. the kernel's own answer for the same call.

The oracle is the same agent, same uid (65534), calling the kernel directly (the call needs
no privilege). Expected differences are exactly the documented ones (docs/semantics.md):
the MAC trailer (+20 bytes, also in EOVERFLOW's required size), EOPNOTSUPP for objects that
are not directories or regular files, EACCES for objects outside the share, ELOOP for magic
links.
"""

from __future__ import annotations

import errno
import stat
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.support import Agent, World
from tests.support.handles import CANARY, TRAILER, N2HResult

AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
AT_HANDLE_FID = 0x200
AT_HANDLE_MNT_ID_UNIQUE = 0x001
AT_HANDLE_CONNECTABLE = 0x002

COMPONENTS = ["file", "dir", "deep", "inner", "leaf", "link_in", "link_deep", "link_out",
              "link_abs", "loop_a", "link_dir", "fifo", "null", "readonly", "rootonly",
              "noexec", "hidden", "emptydir", "missing", "..", ".", "", "hardlink_out",
              "x" * 300]


@pytest.fixture(scope="module")
def pair(world: World, fhmon: Any, request: pytest.FixtureRequest) -> tuple[Agent, Agent]:
    fh = Agent(world, "fhmon", world.main, fhmon.socket)
    kern = Agent(world, "plain", world.main)
    for agent in (fh, kern):
        agent.call("open", name="d_dir", path="dir", flags=0o200000)
        agent.call("open", name="d_file", path="file", flags=0)
        agent.call("open", name="d_opath", path="dir", flags=0o10000000)
    request.addfinalizer(fh.close)
    request.addfinalizer(kern.close)
    return fh, kern


VALID_FLAGS = (AT_SYMLINK_FOLLOW | AT_EMPTY_PATH | AT_HANDLE_FID | AT_HANDLE_MNT_ID_UNIQUE
               | AT_HANDLE_CONNECTABLE)


def flags_valid(flags: int) -> bool:
    if flags & ~VALID_FLAGS:
        return False
    return not (flags & AT_HANDLE_CONNECTABLE and flags & (AT_HANDLE_FID | AT_EMPTY_PATH))


def expected_divergence(kern: N2HResult, where: dict[str, Any], world: World,
                        call: dict[str, Any]) -> int | None:
    """The errno fhmon must give where the kernel got past the lookup, if any.

    fhmon's own refusals sit where the kernel's EOPNOTSUPP sits: after the lookup, before
    the handle header is read. So they replace the kernel's later answers: success,
    EOVERFLOW, EFAULT on the handle or mount id, EINVAL for handle_bytes > 128.
    """
    late = kern.errno in (0, errno.EOVERFLOW) or (
        kern.errno in (errno.EFAULT, errno.EINVAL) and flags_valid(call["flags"])
        and call["path_place"] in ("normal", "end_of_page"))
    if not late:
        return None
    if where.get("errno"):
        return None
    target = where["path"]
    main = str(world.main)
    if not (target == main or target.startswith(main + "/")):
        return errno.EACCES
    if not (stat.S_ISDIR(where["mode"]) or stat.S_ISREG(where["mode"])):
        return errno.EOPNOTSUPP
    return None


def check_pair(fh_raw: dict[str, Any], kern_raw: dict[str, Any], where: dict[str, Any],
               world: World, call: dict[str, Any]) -> None:
    fh, kern = N2HResult.of(fh_raw), N2HResult.of(kern_raw)
    divergence = expected_divergence(kern, where, world, call)
    context = f"call={call} kernel={kern_raw} fhmon={fh_raw} where={where}"
    if divergence is not None:
        assert fh.errno == divergence, context
        return
    hb_in = call.get("handle_bytes", 128)
    if kern.errno == 0:
        k_len = len(kern.f_handle)
        if hb_in < k_len + TRAILER:
            assert fh.errno == errno.EOVERFLOW, context
            assert fh.handle_bytes == k_len + TRAILER and fh.handle_type == 255, context
            assert fh.mount_mem == kern.mount_mem, context
            return
        assert fh.errno == 0, context
        assert fh.handle_type == kern.handle_type, context
        assert fh.handle_bytes == k_len + TRAILER, context
        assert fh.f_handle[:k_len] == kern.f_handle, context
        assert fh.mount_mem == kern.mount_mem, context
        assert fh.untouched_from(8 + k_len + TRAILER), context
        return
    assert fh.errno == kern.errno, context
    if kern.errno == errno.EOVERFLOW:
        assert fh.handle_bytes == (kern.handle_bytes or 0) + TRAILER, context
        assert fh.handle_type == kern.handle_type == 255, context
        assert fh.mount_mem == kern.mount_mem, context
        assert fh.written_extent() == kern.written_extent() == 8, context
    elif fh.memory is not None and kern.memory is not None:
        # Failed calls write nothing (or exactly what the kernel wrote).
        assert fh.memory == kern.memory, context


paths = st.lists(st.sampled_from(COMPONENTS), min_size=0, max_size=4).map(
    lambda parts: "/".join(parts))
flag_bits = st.sets(st.sampled_from([AT_SYMLINK_FOLLOW, AT_EMPTY_PATH, AT_HANDLE_FID,
                                     AT_HANDLE_MNT_ID_UNIQUE, AT_HANDLE_CONNECTABLE, 0x4,
                                     0x100, 0x800])).map(sum)
handle_bytes = st.sampled_from([0, 1, 4, 7, 8, 12, 16, 27, 28, 29, 32, 64, 108, 127, 128, 129,
                                2**31, 2**32 - 1])
dirfds = st.sampled_from(["cwd", "share", "d_dir", "d_file", "d_opath", 999, -1])
places = st.sampled_from(["normal", "normal", "normal", "end_of_page", "straddle", "unmapped",
                          "readonly", "null"])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=paths, flags=flag_bits, hb=handle_bytes, dirfd=dirfds,
       path_place=st.sampled_from(["normal"] * 6 + ["unmapped", "null", "end_of_page"]),
       handle_place=places, mount_place=places, absolute=st.booleans())
def test_name_to_handle_at_matches_kernel(pair: tuple[Agent, Agent], world: World, path: str,
                                          flags: int, hb: int, dirfd: Any, path_place: str,
                                          handle_place: str, mount_place: str,
                                          absolute: bool) -> None:
    fh, kern = pair
    edge = {"end_of_page", "straddle"}
    at_edge = [p for p in (path_place, handle_place, mount_place) if p in edge]
    assume(len(at_edge) <= 1)  # one guard page: buffers placed against it would overlap
    if absolute:
        path = f"{world.main}/{path}"
    call = {"path": path, "flags": flags, "handle_bytes": hb, "dirfd": dirfd,
            "path_place": path_place, "handle_place": handle_place,
            "mount_id_place": mount_place}
    kern_raw = kern.call("n2h", **call)
    fh_raw = fh.call("n2h", **call)
    readable = path_place in ("normal", "end_of_page")
    where = kern.call("whereis", path=path, dirfd=dirfd,
                      follow=bool(flags & AT_SYMLINK_FOLLOW)) if readable else {"errno": -1}
    check_pair(fh_raw, kern_raw, where, world, call)


@pytest.mark.parametrize("path,flags", [
    ("file", 0), ("dir", 0), ("", AT_EMPTY_PATH), ("dir/inner", AT_HANDLE_FID),
    ("dir/deep/leaf", AT_HANDLE_MNT_ID_UNIQUE), ("dir/inner", AT_HANDLE_CONNECTABLE),
    ("link_in", AT_SYMLINK_FOLLOW), ("link_dir", AT_SYMLINK_FOLLOW), ("dir/", 0),
])
def test_success_cases_are_identical_but_for_the_trailer(pair: tuple[Agent, Agent],
                                                         world: World, path: str,
                                                         flags: int) -> None:
    fh, kern = pair
    k = N2HResult.of(kern.call("n2h", path=path, flags=flags))
    f = N2HResult.of(fh.call("n2h", path=path, flags=flags))
    assert k.errno == 0 and f.errno == 0, (k, f)
    assert f.f_handle[:-TRAILER] == k.f_handle
    assert f.handle_type == k.handle_type
    assert f.mount_mem == k.mount_mem
    # The same file always gives the same bytes (virtiofsd keys inodes by them).
    again = N2HResult.of(fh.call("n2h", path=path, flags=flags))
    assert again.f_handle == f.f_handle and again.memory == f.memory


def test_overflow_reports_size_with_trailer(pair: tuple[Agent, Agent]) -> None:
    fh, kern = pair
    k = N2HResult.of(kern.call("n2h", path="file", handle_bytes=0))
    f = N2HResult.of(fh.call("n2h", path="file", handle_bytes=0))
    assert k.errno == f.errno == errno.EOVERFLOW
    assert f.handle_bytes == (k.handle_bytes or 0) + TRAILER
    assert f.memory is not None and f.memory[8:] == bytes([CANARY]) * (len(f.memory) - 8)


def test_bad_mount_id_pointer_beats_overflow(pair: tuple[Agent, Agent]) -> None:
    fh, kern = pair
    call = {"path": "file", "handle_bytes": 0, "mount_id_place": "unmapped"}
    assert kern.call("n2h", **call)["errno"] == errno.EFAULT
    assert fh.call("n2h", **call)["errno"] == errno.EFAULT
