"""Forgery: a hostile target presents handles fhmon never signed for its share.

Documented answers (docs/semantics.md, open_by_handle_at): header checks first, as the
kernel (EINVAL for handle_bytes 0 or > 128 and for bad handle types, EFAULT for unreadable
bytes); then any MAC that is not right for this share, type, length and a known key: ESTALE.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import intake_wire
from tests.adversarial.common import FORGERY, TRAILER, errname, obh_errno, signed, wait_for
from tests.adversarial.guard import Baseline
from tests.adversarial.recording import Recorder
from tests.support import FHMON, Agent, Service, World
from tests.support.handles import N2HResult
from tests.support.listeners import send_raw


@pytest.fixture
def target(spawn: Any) -> Agent:
    agent: Agent = spawn()
    return agent


@pytest.fixture
def root_plain(spawn: Any) -> Agent:
    """A root process straight on the kernel: where raw kernel handles come from."""
    agent: Agent = spawn("plain", user=None)
    return agent


def test_random_handles(target: Agent, record: Recorder) -> None:
    htype, good = signed(target, "file")
    rng = random.Random(0xF0F0)
    cases: list[bytes] = []
    for length in (1, 4, 8, 19, 20, 21, len(good) - 1, len(good), len(good) + 1, 64, 108,
                   127, 128):
        cases += [rng.randbytes(length) for _ in range(6)]
        cases += [b"\0" * length, b"\xff" * length]
    record.every(FORGERY, "random handles of 1..128 bytes, all-zero and all-ones ones",
                 errno.ESTALE, [obh_errno(target, htype, c) for c in cases])


def test_every_bit_flip(target: Agent, record: Recorder) -> None:
    htype, good = signed(target, "dir/deep/leaf")
    assert obh_errno(target, htype, good) == 0
    results = []
    for bit in range(len(good) * 8):
        forged = bytearray(good)
        forged[bit // 8] ^= 1 << (bit % 8)
        results.append(obh_errno(target, htype, bytes(forged)))
    record.every(FORGERY, "a signed handle with one bit flipped, every bit in turn "
                 "(kernel bytes, key id, MAC)", errno.ESTALE, results)


def test_truncated_and_extended(target: Agent, record: Recorder) -> None:
    htype, good = signed(target, "file")
    rng = random.Random(11)
    truncated = [good[:n] for n in range(1, len(good))] + [good[1:], good[TRAILER:]]
    record.every(FORGERY, "a signed handle truncated at every length, or cut at the front",
                 errno.ESTALE, [obh_errno(target, htype, t) for t in truncated])
    extended = [good + b"\0", good + rng.randbytes(1), good + rng.randbytes(20),
                good + good[-TRAILER:], (good + b"\0" * 128)[:128], good[:-TRAILER] + good]
    record.every(FORGERY, "a signed handle with bytes appended (zeros, random, a second "
                 "trailer, padded to 128)", errno.ESTALE,
                 [obh_errno(target, htype, e) for e in extended])


def test_trailer_surgery(target: Agent, root_plain: Agent, world: World,
                         record: Recorder) -> None:
    htype, good = signed(target, "file")
    _, other = signed(target, "dir/inner")
    kernel_bytes, key_id, mac = good[:-TRAILER], good[-TRAILER:-16], good[-16:]
    unknown_id = (int.from_bytes(key_id, "big") ^ 0x5A5A5A5A).to_bytes(4, "big")
    record(FORGERY, "key id replaced by an unknown one, MAC kept", errno.ESTALE,
           obh_errno(target, htype, kernel_bytes + unknown_id + mac))
    record(FORGERY, "MAC zeroed", errno.ESTALE,
           obh_errno(target, htype, kernel_bytes + key_id + b"\0" * 16))
    record(FORGERY, "trailer of one file grafted onto another file's kernel bytes",
           errno.ESTALE, obh_errno(target, htype, other[:-TRAILER] + good[-TRAILER:]))
    raw = N2HResult.of(root_plain.call("n2h", path=str(world.outside / "secret")))
    assert raw.errno == 0
    record(FORGERY, "kernel bytes of a host file outside the share + a valid trailer",
           errno.ESTALE, obh_errno(target, int(raw.handle_type or 0),
                                   raw.f_handle + good[-TRAILER:]))


def test_handle_of_another_share(spawn: Any, world: World, record: Recorder) -> None:
    main: Agent = spawn(share=world.main)
    other: Agent = spawn(share=world.other)
    htype, theirs = signed(other, "sub/theirs")
    assert obh_errno(other, htype, theirs) == 0
    record(FORGERY, "a valid handle of another share (same filesystem, same key)",
           errno.ESTALE, obh_errno(main, htype, theirs))
    htype, root_of_other = signed(other, ".")
    record(FORGERY, "the other share's root directory handle", errno.ESTALE,
           obh_errno(main, htype, root_of_other, flags=0o200000))
    htype, mine = signed(main, "file")
    record(FORGERY, "a handle of this share presented in the other share", errno.ESTALE,
           obh_errno(other, htype, mine))


def test_handle_bytes_lies(target: Agent, root_plain: Agent, record: Recorder) -> None:
    """The header checks, against the kernel's own (root, the raw handle, same placement)."""
    htype, good = signed(target, "file")
    raw = N2HResult.of(root_plain.call("n2h", path="file")).f_handle

    for hb, expected in ((0, errno.EINVAL), (129, errno.EINVAL), (2**31, errno.EINVAL),
                         (2**32 - 1, errno.EINVAL)):
        kernel = root_plain.call("obh", handle_type=htype, f_handle=raw.hex(), handle_bytes=hb)
        got = obh_errno(target, htype, good, handle_bytes=hb)
        record(FORGERY, f"handle_bytes = {hb}", expected,
               f"{errname(got)} (kernel: {errname(kernel['errno'])})",
               ok=got == expected == kernel["errno"])
    record(FORGERY, "handle_bytes says 4 bytes fewer than the MAC covers", errno.ESTALE,
           obh_errno(target, htype, good, handle_bytes=len(good) - 4))
    record(FORGERY, "handle_bytes says 4 bytes more than the MAC covers (zeros follow)",
           errno.ESTALE, obh_errno(target, htype, good + b"\0" * 4,
                                   handle_bytes=len(good) + 4))
    kernel = root_plain.call("obh", handle_type=htype, f_handle=raw.hex(),
                             handle_bytes=len(raw) + 8, handle_place="end_of_page")
    got = obh_errno(target, htype, good, handle_bytes=len(good) + 8,
                    handle_place="end_of_page")
    record(FORGERY, "handle_bytes runs 8 bytes past the end of the mapping", errno.EFAULT,
           f"{errname(got)} (kernel: {errname(kernel['errno'])})",
           ok=got == kernel["errno"] == errno.EFAULT)


@pytest.mark.parametrize("change,expected", [
    (lambda t: t + 1, errno.ESTALE),
    (lambda t: 0, errno.ESTALE),
    (lambda t: 255, errno.ESTALE),
    (lambda t: t | 0x10000, errno.ESTALE),  # FILEID_IS_CONNECTABLE: a valid user flag
    (lambda t: t | 0x20000, errno.ESTALE),  # FILEID_IS_DIR
    (lambda t: -1, errno.EINVAL),
    (lambda t: t | 0x40000, errno.EINVAL),  # an unknown user flag
    (lambda t: 0x7FFFFFFF, errno.EINVAL),
], ids=["plus1", "zero", "255", "connectable", "is_dir", "minus1", "unknown_flag", "max"])
def test_handle_type_changed(target: Agent, record: Recorder, change: Any,
                             expected: int) -> None:
    htype, good = signed(target, "file")
    new_type = int(change(htype))
    record(FORGERY, f"handle_type {htype} changed to {new_type:#x}", expected,
           obh_errno(target, new_type, good))


def test_kernel_handles_obtained_elsewhere(target: Agent, root_plain: Agent, world: World,
                                          record: Recorder) -> None:
    for path in ("file", "dir", str(world.outside / "secret"), "/etc/passwd"):
        raw = N2HResult.of(root_plain.call("n2h", path=path))
        assert raw.errno == 0, raw
        htype = int(raw.handle_type or 0)
        record(FORGERY, f"raw kernel handle of {Path(path).name!r}, obtained by a root process",
               errno.ESTALE, obh_errno(target, htype, raw.f_handle))
        record(FORGERY, f"raw kernel handle of {Path(path).name!r} + 20 zero bytes",
               errno.ESTALE, obh_errno(target, htype, raw.f_handle + b"\0" * TRAILER))


# --- the same property in plain assertions (not rows of the table) ----------------------------

def test_every_bit_flip_is_stale(target: Agent) -> None:
    htype, good = signed(target, "file")
    assert obh_errno(target, htype, good) == 0
    for bit in range(len(good) * 8):
        forged = bytearray(good)
        forged[bit // 8] ^= 1 << (bit % 8)
        assert obh_errno(target, htype, bytes(forged)) == errno.ESTALE, bit


def test_random_truncated_extended_and_retyped(target: Agent) -> None:
    htype, good = signed(target, "dir/inner")
    rng = random.Random(7)
    cases = [rng.randbytes(len(good)) for _ in range(50)]
    cases += [good[:n] for n in range(1, len(good))]
    cases += [good + b"\0", good + rng.randbytes(20), b"\0" * len(good)]
    for forged in cases:
        assert obh_errno(target, htype, forged) == errno.ESTALE, forged.hex()
    assert obh_errno(target, htype + 1, good) == errno.ESTALE
    assert obh_errno(target, htype, good, handle_bytes=len(good) - 4) == errno.ESTALE


def test_a_raw_kernel_handle_is_stale(target: Agent, spawn: Any) -> None:
    root: Agent = spawn("plain", user=None)
    raw = N2HResult.of(root.call("n2h", path="file"))
    assert raw.errno == 0
    assert obh_errno(target, int(raw.handle_type or 0), raw.f_handle) == errno.ESTALE


def test_handle_of_another_share_is_stale(spawn: Any, world: World) -> None:
    a: Agent = spawn(share=world.main)
    b: Agent = spawn(share=world.other)
    htype, from_b = signed(b, "sub/theirs")
    assert obh_errno(b, htype, from_b) == 0
    assert obh_errno(a, htype, from_b) == errno.ESTALE
    htype, from_a = signed(a, "file")
    assert obh_errno(b, htype, from_a) == errno.ESTALE


def test_handles_are_deterministic_across_targets(spawn: Any) -> None:
    a: Agent = spawn()
    b: Agent = spawn()
    assert signed(a, "dir/deep/leaf") == signed(b, "dir/deep/leaf")


# --- unknown and retired keys: a private fhmon whose key dir the test controls ----------------

def keygen(key_dir: Path) -> str:
    out = subprocess.run([FHMON, "keygen", "--key-dir", str(key_dir)], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def key_id(f_handle: bytes) -> str:
    return f_handle[-TRAILER:-16].hex()


@pytest.fixture
def keyed(world: World) -> Iterator[Service]:
    with Service(world.base, [str(world.shares / "*")], name="adv-keys") as service:
        yield service


def test_unknown_and_retired_keys(keyed: Service, fhmon: Service, world: World,
                                  record: Recorder) -> None:
    baseline = Baseline(keyed)
    agent = Agent(world, "fhmon", world.main, keyed.socket)
    elsewhere = Agent(world, "fhmon", world.main, fhmon.socket)
    try:
        htype, old = signed(agent, "file")
        old_id = key_id(old)
        assert obh_errno(agent, htype, old) == 0
        _, foreign = signed(elsewhere, "file")
        record(FORGERY, "a handle signed by another fhmon (unknown key id) for the same share",
               errno.ESTALE, obh_errno(agent, htype, foreign))
        record(FORGERY, "this fhmon's handle presented to the other fhmon", errno.ESTALE,
               obh_errno(elsewhere, htype, old))

        keygen(keyed.key_dir)  # a new signer; the old key still verifies
        assert wait_for(lambda: key_id(signed(agent, "file")[1]) != old_id, 10)
        _, new = signed(agent, "file")
        record(FORGERY, "rotation: a handle of the previous signing key, still present",
               0, obh_errno(agent, htype, old))
        (keyed.key_dir / f"{old_id}.key").unlink()
        os.kill(keyed.pid, signal.SIGHUP)
        retired = wait_for(lambda: obh_errno(agent, htype, old) == errno.ESTALE, 10)
        record(FORGERY, "a handle of a retired key (key file removed, SIGHUP)", errno.ESTALE,
               obh_errno(agent, htype, old), ok=retired)
        record(FORGERY, "the new key's handle after the retirement", 0,
               obh_errno(agent, htype, new))

        # Same key id, different key material (an impostor node): the MAC does not verify.
        impostor_keys = world.base / "adv-impostor-keys"
        impostor_keys.mkdir(mode=0o700)
        (impostor_keys / f"{key_id(new)}.key").write_text(os.urandom(32).hex() + "\n")
        (impostor_keys / f"{key_id(new)}.key").chmod(0o600)
        (impostor_keys / "signing-key-id").write_text(key_id(new) + "\n")
        with Service(world.base, [str(world.shares / "*")], name="adv-impostor",
                     key_dir=impostor_keys) as impostor:
            spy = Agent(world, "fhmon", world.main, impostor.socket)
            try:
                _, forged = signed(spy, "file")
                assert key_id(forged) == key_id(new) and forged != new
                record(FORGERY, "a handle signed with the same key id but other key bytes",
                       errno.ESTALE, obh_errno(agent, htype, forged))
            finally:
                spy.close()
    finally:
        agent.close()
        elsewhere.close()
    assert not baseline.settle()


def test_key_material_never_leaves_fhmon(fhmon: Service, record: Recorder) -> None:
    """What a socket client or a log reader can see: key ids, never key bytes."""
    keys = [p.read_text().strip() for p in fhmon.key_dir.glob("*.key")]
    assert keys
    status = json.dumps(fhmon.status())
    pong = send_raw(fhmon.socket, intake_wire.encode(intake_wire.Ping()))
    seen = [k for k in keys for text in (status, pong.decode(errors="replace"),
                                         fhmon.log_text())
            if k.lower() in text.lower() or k[:16].lower() in text.lower()]
    record(FORGERY, "look for key bytes in STATUS, PONG and fhmon's log", "absent",
           "absent" if not seen else f"FOUND {len(seen)} times")
    mode = oct(fhmon.key_dir.stat().st_mode & 0o777)
    record(FORGERY, "the key directory's mode", "0o700", mode)
