"""The key directory: operator error (or a hostile co-admin) must not hang or crash fhmon.

A FIFO named like a key used to hang the key watcher in open() (probes timed out, SIGTERM
was ignored), a key that is a link to /dev/zero made fhmon read until MemoryError, and a key
file written in place was picked up half-written (handles signed with the cut key stopped
verifying once the file was whole). Each attack here is made against a real `fhmon serve`
whose key directory is changed under it while a real target calls.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.adversarial.common import EXHAUSTION, errname, signed, wait_for
from tests.adversarial.recording import Recorder
from tests.support import FHMON, Agent, Service, World

PLANTED = "0badc0de.key"


def probe(service: Service, timeout: float = 5.0) -> tuple[int | None, str]:
    """`fhmon probe`'s exit status and output; None if fhmon did not answer in time."""
    try:
        res = subprocess.run([FHMON, "probe", "--socket", service.socket],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "no answer"
    return res.returncode, res.stdout + res.stderr


def reload_failures(service: Service) -> list[str]:
    return [str(e.get("error")) for e in service.events()
            if e.get("event") == "keys_reload_failed"]


@pytest.fixture(scope="module")
def keyed(world: World) -> Iterator[tuple[Service, Agent]]:
    service = Service(world.base, [str(world.shares / "*")], name="keydir")
    agent = Agent(world, "fhmon", world.main, service.socket)
    try:
        yield service, agent
    finally:
        agent.close()
        if service.proc is not None and service.proc.poll() is None:
            service.stop()


def plant(key_dir: Path, kind: str) -> Path:
    path = key_dir / PLANTED
    if kind == "a FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "a symlink to /dev/zero":
        os.symlink("/dev/zero", path)
    elif kind == "a symlink to /dev/urandom":
        os.symlink("/dev/urandom", path)
    elif kind == "a character device node (/dev/zero's numbers)":
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 5))
    elif kind == "a directory":
        path.mkdir(mode=0o700)
    elif kind == "a 64 MiB regular file":
        with open(path, "wb") as handle:
            handle.truncate(64 << 20)
        path.chmod(0o600)
    elif kind == "a symlink to a FIFO inside the directory":
        os.mkfifo(key_dir / ".fifo", 0o600)
        os.symlink(".fifo", path)
    elif kind == "a symlink to a valid key outside the directory":
        outside = key_dir.parent / "stray.key"
        shutil.copy(next(key_dir.glob("*.key")), outside)
        os.symlink(str(outside), path)
    else:
        raise AssertionError(kind)
    return path


def unplant(key_dir: Path) -> None:
    for path in (key_dir / PLANTED, key_dir / ".fifo", key_dir.parent / "stray.key"):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif path.exists() or path.is_symlink():
            path.unlink()


HOSTILE = ["a FIFO", "a symlink to /dev/zero", "a symlink to /dev/urandom",
           "a character device node (/dev/zero's numbers)", "a directory",
           "a 64 MiB regular file", "a symlink to a FIFO inside the directory",
           "a symlink to a valid key outside the directory"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_key_entry_is_refused_and_the_old_keys_stay(
        keyed: tuple[Service, Agent], record: Recorder, kind: str) -> None:
    service, agent = keyed
    htype, handle = signed(agent, "file")
    failures_before = len(reload_failures(service))
    try:
        plant(service.key_dir, kind)
        noticed = wait_for(lambda: len(reload_failures(service)) > failures_before, 10)
        code, _ = probe(service)
        opened = agent.call("obh", handle_type=htype, f_handle=handle.hex(),
                            answer_within=10)["errno"]
        _, again = signed(agent, "file")
        logged = reload_failures(service)[failures_before:]
        observed = (f"reload {'refused: ' + logged[0] if logged else 'NOT refused'}; "
                    f"probe {'no answer' if code is None else f'exit {code}'}; old handle "
                    f"{errname(opened)}; signer {'kept' if again == handle else 'CHANGED'}")
        record(EXHAUSTION, f"the key directory gains {kind} named like a key ({PLANTED}) "
               "while a target calls", "refused with one log line naming it; probe answers "
               "(not ok); the old keys keep signing and verifying", observed,
               ok=(noticed and len(logged) == 1 and PLANTED in logged[0] and code == 1
                   and opened == 0 and again == handle))
    finally:
        unplant(service.key_dir)
    assert wait_for(lambda: probe(service)[0] == 0, 10), "fhmon did not recover"


def test_sigterm_stops_fhmon_while_a_fifo_sits_in_the_key_dir(world: World,
                                                              record: Recorder) -> None:
    service = Service(world.base, [str(world.shares / "*")], name="keydir-sigterm")
    try:
        failures = len(reload_failures(service))
        plant(service.key_dir, "a FIFO")
        wait_for(lambda: len(reload_failures(service)) > failures, 10)
        time.sleep(1.5)  # the watcher looks again; before the fix it would sit in open()
        assert service.proc is not None
        service.proc.send_signal(signal.SIGTERM)
        try:
            code: int | str = service.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = "still running after 10 s"
        record(EXHAUSTION, "SIGTERM to fhmon while a FIFO named like a key sits in its key "
               "directory", "exits 0 within 10 s", f"exit {code}"
               if isinstance(code, int) else code, ok=code == 0)
    finally:
        if service.proc is not None and service.proc.poll() is None:
            service.proc.kill()
            service.proc.wait()
        unplant(service.key_dir)


def test_a_key_written_in_place_is_taken_only_when_whole(keyed: tuple[Service, Agent],
                                                         record: Recorder) -> None:
    """The operator writes a new 64-byte key in place (not renamed into place) and makes it
    the signer: while the file is cut, fhmon must go on with the old ring, so that a handle
    signed then still verifies once the new key is whole."""
    service, agent = keyed
    _, old_handle = signed(agent, "file")
    key_id = "00c0ffee"
    key = bytes(range(64))
    text = key.hex() + "\n"  # a hand-made key: no check line
    path = service.key_dir / f"{key_id}.key"
    signer = service.key_dir / "signing-key-id"
    old_signer = signer.read_text()
    failures = len(reload_failures(service))
    try:
        with open(path, "w") as handle:
            os.fchmod(handle.fileno(), 0o600)
            handle.write(text[:80])  # 40 bytes of key, more than the 32 a key needs
            handle.flush()
            tmp = service.key_dir / ".signer.tmp"
            tmp.write_text(f"{key_id}\n")
            tmp.chmod(0o600)
            tmp.rename(signer)
            refused = wait_for(lambda: len(reload_failures(service)) > failures, 10)
            time.sleep(1.2)  # the watcher has looked at least once more
            htype, during = signed(agent, "file")
            handle.write(text[80:])
        took_new = wait_for(lambda: signed(agent, "file")[1][-20:-16].hex() == key_id
                            and probe(service)[0] == 0, 10)
        time.sleep(2.5)  # the watcher (every second) has surely read the whole file now
        later = agent.call("obh", handle_type=htype, f_handle=during.hex())["errno"]
        old = agent.call("obh", handle_type=htype, f_handle=old_handle.hex())["errno"]
        logged = reload_failures(service)[failures:]
        record(EXHAUSTION, "a 64-byte key is written in place in two steps (the first "
               "40 bytes, then the rest) while it is already named the signer",
               "the cut file is refused (old ring kept); the whole file is taken; handles "
               "signed meanwhile still verify",
               f"cut file {'refused: ' + logged[0] if refused and logged else 'ACCEPTED'}; "
               f"whole file {'taken' if took_new else 'NOT taken'}; handle signed meanwhile "
               f"(key {during[-20:-16].hex()}): {errname(later)}; older handle: "
               f"{errname(old)}",
               ok=refused and bool(logged) and "incomplete" in logged[0] and took_new
               and later == 0 and old == 0)
    finally:
        tmp = service.key_dir / ".signer.tmp"
        tmp.write_text(old_signer)
        tmp.chmod(0o600)
        tmp.rename(signer)
        path.unlink(missing_ok=True)
    assert wait_for(lambda: signed(agent, "file")[1] == old_handle, 10)
