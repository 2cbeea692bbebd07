"""The kernel decides: under each runtime profile the KubeVirt virtiofs container would run
under, open_by_handle_at is refused (EPERM) before the launcher's notify filter can hand it
to fhmon; under fhmon's derived profile both handle calls reach the notify filter. The
profile is compiled by libseccomp (as runc compiles it) for a container without
capabilities, stacked with fhmon's real notify filter, in a child running as uid 65534."""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path

import pytest

from monitor import seccomp_filter
from monitor.kubevirt import seccomp
from monitor.listener import Listener
from tests.support import readable

ROOT = Path(__file__).resolve().parents[2]
BASES = ROOT / "tests" / "data" / "seccomp"
SHIPPED = ROOT / "deploy" / "seccomp"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the child drops to uid 65534")

# The container's side: load the profile as runc would for a container with no
# capabilities on this architecture, then make the two handle calls and print their errno.
CHILD = r"""
import ctypes, errno, json, sys
import pyseccomp as s
profile = json.load(open(sys.argv[1]))
ops = {"SCMP_CMP_EQ": s.EQ, "SCMP_CMP_NE": s.NE, "SCMP_CMP_LT": s.LT, "SCMP_CMP_LE": s.LE,
       "SCMP_CMP_GT": s.GT, "SCMP_CMP_GE": s.GE, "SCMP_CMP_MASKED_EQ": s.MASKED_EQ}
def action(name, ret):
    return {"SCMP_ACT_ALLOW": s.ALLOW, "SCMP_ACT_ERRNO": s.ERRNO(ret)}[name]
default_ret = profile.get("defaultErrnoRet", errno.EPERM)
flt = s.SyscallFilter(action(profile["defaultAction"], default_ret))
for rule in profile["syscalls"]:
    includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
    if includes.get("caps") or includes.get("minKernel"):
        continue  # the container holds no capability
    if includes.get("arches") and "amd64" not in includes["arches"]:
        continue
    if "amd64" in (excludes.get("arches") or []):
        continue
    act = action(rule["action"], rule.get("errnoRet", errno.EPERM))
    args = [s.Arg(a["index"], ops[a["op"]], a["value"], a.get("valueTwo", 0))
            for a in rule.get("args") or []]
    for name in rule.get("names") or [rule["name"]]:
        try:
            flt.add_rule(act, name, *args)
        except (OSError, RuntimeError, ValueError):
            pass  # unknown to this libseccomp/arch: runc skips those too
flt.load()
libc = ctypes.CDLL(None, use_errno=True)
handle = (ctypes.c_ubyte * 136)()
ctypes.memmove(handle, (8).to_bytes(4, "little") + (1).to_bytes(4, "little"), 8)
mount_id = ctypes.c_int()
for name, number, args in (("open_by_handle_at", 304, (-100, handle, 0)),
                           ("name_to_handle_at", 303, (-100, b"/", handle,
                                                       ctypes.byref(mount_id), 0))):
    got = libc.syscall(number, *args)
    print(name, errno.errorcode.get(ctypes.get_errno(), "0") if got < 0 else "ok", flush=True)
"""


def run_under(profile: Path) -> tuple[dict[str, str], list[str]]:
    """(each call's errno in the child, the calls fhmon's listener was asked about); every
    notification is answered ESTALE, so a call that reached the listener says ESTALE."""
    read_end, write_end = os.pipe()
    saved_stdout = os.dup(1)
    os.dup2(write_end, 1)  # the child's stdout
    try:
        pid, listener_fd, channel = seccomp_filter.fork_under_filter(
            (65534, 65534), [sys.executable, "-I", "-c", CHILD, str(profile)])
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        os.close(write_end)
    listener = Listener(listener_fd)
    asked: list[str] = []
    try:
        seccomp_filter.go(channel)
        names = {304: "open_by_handle_at", 303: "name_to_handle_at"}
        while True:
            assert readable(listener_fd, 30), "the child neither called nor exited"
            state = listener.poll()
            if state is None:
                break  # the child is gone
            if state:
                notification = listener.receive_ready()
                if notification is not None:
                    asked.append(names.get(notification.nr, str(notification.nr)))
                    listener.respond(notification.id, error=errno.ESTALE)
        _, status = os.waitpid(pid, 0)
        output = b""
        while chunk := os.read(read_end, 65536):
            output += chunk
        assert os.waitstatus_to_exitcode(status) == 0, output
    finally:
        listener.close()
        channel.close()
        os.close(read_end)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    answers = dict(line.split() for line in output.decode().splitlines())
    return answers, asked


@pytest.mark.parametrize("shipped, base", sorted(seccomp.SHIPPED.items()))
def test_the_base_refuses_before_fhmon_and_the_derived_profile_reaches_it(
        shipped: str, base: str) -> None:
    answers, asked = run_under(BASES / base)
    assert answers["open_by_handle_at"] == "EPERM" and asked == ["name_to_handle_at"]
    answers, asked = run_under(SHIPPED / shipped)
    assert sorted(asked) == ["name_to_handle_at", "open_by_handle_at"]
    assert answers == {"open_by_handle_at": "ESTALE", "name_to_handle_at": "ESTALE"}
