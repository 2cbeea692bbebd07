"""TOCTOU: the target changes what fhmon reads while the call is served, or dies in the middle.

Defences (docs/architecture.md, "Trust boundaries"): fhmon reads each argument once into its
own memory, validates that copy and uses only that copy; every read of target memory is
followed by SECCOMP_IOCTL_NOTIF_ID_VALID before the bytes are used; fds are injected with
ADDFD|SEND, which installs and answers atomically or not at all. Bad pointers give EFAULT
exactly where the kernel gives it (compared with the kernel's own answer, same placement).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import (
    TOCTOU,
    TRAILER,
    errname,
    obh,
    private_file,
    signed,
    wait_for,
)
from tests.adversarial.recording import Recorder
from tests.support import Agent, Service, World, thread_syscalls
from tests.support.handles import N2HResult


@pytest.fixture
def outside_target(world: World) -> Iterator[Path]:
    """A host file outside every share (not hard-linked anywhere): what the attacker wants."""
    with private_file(world.outside / "adv_race_secret", b"outside, never to be opened\n") as p:
        yield p


def struct_handle(htype: int, f_handle: bytes, hb: int | None = None) -> bytes:
    return struct.pack("<Ii", len(f_handle) if hb is None else hb, htype) + f_handle


def test_path_rewritten_while_the_call_is_served(spawn: Any, world: World,
                                                 outside_target: Path,
                                                 record: Recorder) -> None:
    agent: Agent = spawn()
    outside_ino = outside_target.stat().st_ino
    for inside, escape in (("file", "../../outside/adv_race_secret"),
                           ("dir/deep/leaf", str(outside_target))):
        out = agent.call("race", call="n2h", calls=600, seconds=30,
                         variants=[(inside + "\0").encode().hex(),
                                   (escape + "\0").encode().hex()])
        landed: dict[str, int] = {}
        for key, count in out["got"].items():
            htype_text, f_hex = key.split(":")
            opened = obh(agent, int(htype_text), bytes.fromhex(f_hex))
            where = opened.get("path", f"errno {opened['errno']}")
            if opened.get("ino") == outside_ino:
                where = "THE OUTSIDE FILE"
            landed[where] = landed.get(where, 0) + count
        inside_only = all(str(w).startswith(str(world.main) + "/") for w in landed)
        errnos = {errname(int(e)): n for e, n in out["errnos"].items()}
        record(TOCTOU, f"name_to_handle_at while a second thread flips the path between "
               f"{inside!r} and {escape!r} "
               f"({out['flips']} flips)",
               "handles only for objects inside the share; EACCES otherwise",
               f"answers {errnos}; handles opened: {landed}",
               ok=inside_only and out["flips"] > 0
               and set(errnos) <= {"success", "EACCES", "ENOENT", "ENOTDIR"})


def test_handle_rewritten_while_the_call_is_served(spawn: Any, world: World,
                                                   outside_target: Path,
                                                   record: Recorder) -> None:
    agent: Agent = spawn()
    root: Agent = spawn("plain", user=None)
    htype, good = signed(agent, "file")
    _, other = signed(agent, "dir/inner")
    raw = N2HResult.of(root.call("n2h", path=str(outside_target)))
    assert raw.errno == 0 and len(raw.f_handle) == len(good) - TRAILER
    outside_ino = outside_target.stat().st_ino
    races = {
        "the kernel bytes of 'file' and of the outside file, under 'file''s valid trailer": [
            struct_handle(htype, good),
            struct_handle(htype, raw.f_handle + good[-TRAILER:])],
        "two valid handles ('file', 'dir/inner')": [
            struct_handle(htype, good), struct_handle(htype, other)],
        "handle_bytes and handle_type of a valid handle": [
            struct_handle(htype, good), struct_handle(htype | 0x10000, good, hb=len(good) - 4),
            struct_handle(-1, good, hb=200)],
    }
    allowed = {(world.main / "file").stat().st_ino, (world.main / "dir" / "inner").stat().st_ino}
    for what, variants in races.items():
        out = agent.call("race", call="obh", calls=600, seconds=30,
                         variants=[v.hex() for v in variants])
        inodes = {int(key.split(":")[1]): n for key, n in out["got"].items()}
        errnos = {errname(int(e)): n for e, n in out["errnos"].items()}
        record(TOCTOU, f"open_by_handle_at while a second thread flips {what} "
               f"({out['flips']} flips)", "only the share's files open; ESTALE/EINVAL otherwise",
               f"answers {errnos}; outside file opened "
               f"{inodes.get(outside_ino, 0)} times",
               ok=set(inodes) <= allowed and outside_ino not in inodes and out["flips"] > 0
               and set(errnos) <= {"success", "ESTALE", "EINVAL"})


# --- a target killed in the middle of its calls ------------------------------------------------

def fresh_agent_fds(world: World, fhmon: Service) -> int:
    probe = Agent(world, "fhmon", world.main, fhmon.socket)
    try:
        return int(probe.call("fdcount")["fds"])
    finally:
        probe.close()


def handler_failures(service: Service) -> list[str]:
    """The last line of every exception fhmon logged (a handler that failed answers EIO)."""
    return [str(e["exception"]).strip().splitlines()[-1] for e in service.events()
            if "exception" in e]


def start_hammer(victim: Agent, op: str, path: str = "dir/inner") -> None:
    htype, handle = signed(victim, "dir/inner")
    assert victim.proc.stdin is not None
    victim.proc.stdin.write(json.dumps({
        "op": "hammer", "path": path, "calls": 1000000, "threads": 4, "op2": op,
        "obh": {"handle_type": htype, "f_handle": handle.hex()}}) + "\n")
    victim.proc.stdin.flush()


def kill_and_wait_gone(victim: Agent, fhmon: Service) -> bool:
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    return wait_for(lambda: victim.pid not in [t["pid"] for t in fhmon.status()["targets"]],
                    10)


@pytest.mark.parametrize("op,delay", [("n2h", 0.15), ("obh", 0.3), ("mix", 0.5)])
def test_target_killed_mid_call(spawn: Any, world: World, fhmon: Service, record: Recorder,
                                op: str, delay: float) -> None:
    """The kill lands while fhmon reads, resolves, writes or injects for some of the 4 calls
    in flight: nothing may reach another process, nothing may stay behind."""
    reference_fds = fresh_agent_fds(world, fhmon)
    victim: Agent = spawn()
    start_hammer(victim, op)
    time.sleep(delay)
    served = next(t["calls"] for t in fhmon.status()["targets"] if t["pid"] == victim.pid)
    gone = kill_and_wait_gone(victim, fhmon)
    newcomer: Agent = spawn()
    first = N2HResult.of(newcomer.call("n2h", path="dir/inner"))
    fds = int(newcomer.call("fdcount")["fds"])
    alive = fhmon.proc is not None and fhmon.proc.poll() is None
    record(TOCTOU, f"target SIGKILLed after {delay}s of calls ({op}) on 4 threads "
           f"({served} calls served)",
           "its calls dropped, listener freed; a new target gets exactly its own answers",
           f"listener freed: {gone}; fhmon alive: {alive}; newcomer: {errname(first.errno)}, "
           f"{fds} fds (a fresh agent has {reference_fds})",
           ok=gone and alive and first.errno == 0 and fds == reference_fds)


DEATH_BUG = (
    "BUG: a target killed while fhmon reads its memory makes process_vm_readv fail with "
    "ESRCH; fhmon (monitor/linux.py process_vm_read[_one], monitor/plane/target_thread.py "
    "read_exact / read_path / write) raises it as an unexpected OSError: the dispatcher logs a "
    "handler traceback and answers EIO, where docs/semantics.md says the call of a dying target is "
    "dropped. Harmless to other targets, but any target can put tracebacks and EIO counts "
    "into fhmon's log and metrics by dying mid-call")
DEATH_TITLE = "A target dying mid-call makes fhmon log a traceback and answer EIO"
DEATH_FIX = (
    "in TargetThread, turn ESRCH (and any error once ID_VALID fails) from process_vm_readv/"
    "writev into NotificationGone, as _open_proc_link already does for /proc lookups.")


@pytest.mark.finding(DEATH_TITLE, DEATH_FIX)
def test_a_dying_target_is_dropped_quietly(spawn: Any, fhmon: Service,
                                           record: Recorder) -> None:
    before = len(handler_failures(fhmon))
    kills = 0
    while kills < 30:  # about every other kill lands in the window (1e-9 to miss 30 times)
        kills += 1
        victim: Agent = spawn()
        # Long lookups: the kill most likely lands while fhmon walks the path, before it
        # reads the handle header from the (then dead) caller.
        start_hammer(victim, "n2h", "./" * 2040 + "dir/inner")
        time.sleep(0.15)
        assert kill_and_wait_gone(victim, fhmon)
        if len(handler_failures(fhmon)) > before:
            break
    failures = handler_failures(fhmon)[before:]
    record(TOCTOU, f"targets SIGKILLed mid-call ({kills} kills): fhmon's own errors",
           "no handler exception (calls dropped)", "; ".join(sorted(set(failures))) or
           "no handler exception (calls dropped)")


def blocked_in_syscall(pid: int, nr: int) -> bool:
    return any(fields[0] == str(nr) for fields in thread_syscalls(pid).values())


def all_stopped(pid: int) -> bool:
    """Every thread of pid is in the stopped state: kill(SIGSTOP) returns before that, and a
    thread still running (fhmon's dispatch thread) would answer the next call."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            states.append(Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                          .rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return bool(states) and all(state == "T" for state in states)


def test_call_queued_while_fhmon_is_paused_then_caller_killed(spawn: Any, fhmon: Service,
                                                              record: Recorder) -> None:
    victim: Agent = spawn()
    assert N2HResult.of(victim.call("n2h", path="file")).errno == 0
    assert victim.proc.stdin is not None
    paused = [fhmon.pid, *fhmon.status()["workers"]]  # with `workers`, they answer
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert wait_for(lambda: all(all_stopped(pid) for pid in paused), 10)
        victim.proc.stdin.write('{"op": "n2h", "path": "dir/inner"}\n')
        victim.proc.stdin.flush()
        queued = wait_for(lambda: blocked_in_syscall(victim.pid, 303), 10)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(timeout=10)
        # Churn pids so that the victim's may be handed out again while fhmon sleeps.
        for _ in range(20):
            subprocess.run(["/bin/true"], check=True)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    gone = wait_for(lambda: victim.pid not in [t["pid"] for t in fhmon.status()["targets"]], 10)
    alive = fhmon.proc is not None and fhmon.proc.poll() is None
    record(TOCTOU, "a call queued while fhmon was stopped, its caller SIGKILLed and pids "
           "churned before fhmon resumed", "nothing answered; listener freed; fhmon serves on",
           f"queued: {queued}; listener freed: {gone}; fhmon alive: {alive}",
           ok=queued and gone and alive)


# --- bad pointers: EFAULT exactly where the kernel gives it --------------------------------------

N2H_PLACEMENTS: list[tuple[dict[str, Any], int]] = [
    ({"path_place": "unmapped"}, errno.EFAULT),
    ({"path_place": "null"}, errno.EFAULT),
    ({"path_place": "kernel"}, errno.EFAULT),
    ({"path_place": "straddle"}, errno.EFAULT),  # runs into the unmapped page before its NUL
    ({"path_place": "end_of_page"}, 0),  # NUL is the page's last byte: fine
    ({"handle_place": "unmapped"}, errno.EFAULT),
    ({"handle_place": "readonly"}, errno.EFAULT),
    ({"handle_place": "null"}, errno.EFAULT),
    ({"handle_place": "straddle"}, errno.EFAULT),
    ({"handle_place": "end_of_page", "handle_bytes": 128}, 0),
    ({"mount_id_place": "readonly"}, errno.EFAULT),
    ({"mount_id_place": "unmapped"}, errno.EFAULT),
    ({"mount_id_place": "kernel"}, errno.EFAULT),
]


def test_bad_pointers_name_to_handle_at(spawn: Any, record: Recorder) -> None:
    fh: Agent = spawn()
    kernel: Agent = spawn("plain")
    for placement, expected in N2H_PLACEMENTS:
        got = fh.call("n2h", path="file", **placement)["errno"]
        oracle = kernel.call("n2h", path="file", **placement)["errno"]
        where = ", ".join(f"{k.removesuffix('_place')}={v}" for k, v in placement.items())
        record(TOCTOU, f"name_to_handle_at with {where}", expected,
               f"{errname(got)} (kernel: {errname(oracle)})", ok=got == oracle == expected)


def test_bad_pointers_open_by_handle_at(spawn: Any, record: Recorder) -> None:
    fh: Agent = spawn()
    root: Agent = spawn("plain", user=None)
    htype, good = signed(fh, "file")
    raw = N2HResult.of(root.call("n2h", path="file")).f_handle
    for place, expected in (("unmapped", errno.EFAULT), ("null", errno.EFAULT),
                            ("kernel", errno.EFAULT), ("straddle", errno.EFAULT),
                            ("end_of_page", 0)):
        got = obh(fh, htype, good, handle_place=place)["errno"]
        oracle = root.call("obh", handle_type=htype, f_handle=raw.hex(),
                           handle_place=place)["errno"]
        record(TOCTOU, f"open_by_handle_at with the handle {place}", expected,
               f"{errname(got)} (kernel: {errname(oracle)})", ok=got == oracle == expected)
