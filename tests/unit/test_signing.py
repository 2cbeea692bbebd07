"""monitor.signing: key directory handling, deterministic signing, strict verification.

Only file I/O in pytest's temporary directories; no sockets, no kernel handle calls.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import signal
import stat
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor import signing
from monitor.signing import KeyDirError, KeyRing
from protocol import signed_handle as sh

FAST = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

SHARE = bytes(range(32))
OTHER_SHARE = bytes(range(1, 33))
HANDLE_TYPE = 0x81  # e.g. ext4's FILEID_INO32_GEN_PARENT
KERNEL = bytes.fromhex("0c0000000000000011223344")  # 12 bytes, like ext4


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _key_dir(tmp_path: Path, name: str = "keys") -> Path:
    directory = tmp_path / name
    directory.mkdir(mode=0o700)
    directory.chmod(0o700)
    return directory


def _write_key(directory: Path, key_id: int, key: bytes, mode: int = 0o600) -> Path:
    path = directory / f"{key_id:08x}.key"
    path.write_text(key.hex() + "\n")
    path.chmod(mode)
    return path


def _write_signer(directory: Path, text: str) -> None:
    path = directory / signing.SIGNER_FILE
    path.write_text(text)
    path.chmod(0o600)


def _key_of(directory: Path, key_id: int) -> bytes:
    return bytes.fromhex((directory / f"{key_id:08x}.key").read_text().splitlines()[0])


def _expected_mac(key: bytes, share: bytes, handle_type: int, kernel: bytes,
                  key_id: int) -> bytes:
    """HMAC-SHA256 over the documented message, truncated to 128 bits, built by hand."""
    message = (b"fhmon/handle/v1\x00" + share + struct.pack(">iI", handle_type, len(kernel))
               + kernel + struct.pack(">I", key_id))
    return hmac.new(key, message, hashlib.sha256).digest()[:16]


@pytest.fixture
def key_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "keys"
    signing.keygen(directory)
    return directory


# --- keygen ---------------------------------------------------------------------------------


def test_keygen_creates_private_dir_and_files(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "keys"
    old_umask = os.umask(0o022)
    try:
        key_id = signing.keygen(directory)
    finally:
        os.umask(old_umask)
    assert _mode(directory) == 0o700
    key_file = directory / f"{key_id:08x}.key"
    assert _mode(key_file) == 0o600
    assert _mode(directory / signing.SIGNER_FILE) == 0o600
    text = key_file.read_text()
    key_line, check_line = text.splitlines()
    assert text == f"{key_line}\n{check_line}\n"
    assert len(bytes.fromhex(key_line)) == signing.MIN_KEY_BYTES
    assert check_line == "check " + signing.key_check(bytes.fromhex(key_line))
    assert (directory / signing.SIGNER_FILE).read_text() == f"{key_id:08x}\n"
    assert 0 < key_id < 2**32
    # Nothing else (no leftover temporary files).
    assert sorted(os.listdir(directory)) == sorted([f"{key_id:08x}.key", signing.SIGNER_FILE])


def test_keygen_tightens_an_existing_dir(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    directory.mkdir()
    directory.chmod(0o775)
    signing.keygen(directory)
    assert _mode(directory) == 0o700
    KeyRing.load(directory)


def test_keygen_without_signer_keeps_the_signer(key_dir: Path) -> None:
    first = KeyRing.load(key_dir).signer
    second = signing.keygen(key_dir, make_signer=False)
    assert second != first
    ring = KeyRing.load(key_dir)
    assert ring.signer == first
    assert ring.key_ids == tuple(sorted({first, second}))
    assert ring.describe() == [signing.KeyInfo(k, k == first) for k in sorted({first, second})]


def test_keygen_keys_are_random(tmp_path: Path) -> None:
    a = signing.keygen(tmp_path / "a")
    b = signing.keygen(tmp_path / "b")
    assert _key_of(tmp_path / "a", a) != _key_of(tmp_path / "b", b)


def test_loaded_ring_matches_files(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    (name,) = [e for e in os.listdir(key_dir) if e.endswith(".key")]
    assert ring.key_ids == (int(name[:8], 16),)
    assert ring.signer == int(name[:8], 16)


# --- KeyRing.load errors --------------------------------------------------------------------


def test_load_missing_dir(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KeyDirError) as info:
        KeyRing.load(missing)
    message = str(info.value)
    assert str(missing) in message
    assert "No such file or directory" in message
    assert f"fhmon keygen --key-dir {missing}" in message


def test_load_not_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(KeyDirError, match="is not a directory"):
        KeyRing.load(path)


def test_load_empty_dir(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    with pytest.raises(KeyDirError, match=r"no keys \(<8 hex digits>\.key\) in .*keys"):
        KeyRing.load(directory)


def test_load_ignores_other_names(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    (directory / "README").write_text("not a key")
    (directory / "ABCDEF01.key").write_text("zz")  # upper case: not a key name
    (directory / "1234567.key").write_text("zz")  # 7 digits
    (directory / "123456789.key").write_text("zz")  # 9 digits
    (directory / "12345678.key.bak").write_text("zz")
    with pytest.raises(KeyDirError, match="no keys"):
        KeyRing.load(directory)
    _write_key(directory, 0x12345678, bytes(32))
    _write_signer(directory, "12345678\n")
    assert KeyRing.load(directory).key_ids == (0x12345678,)


def test_load_short_key(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 1, bytes(31))
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match=r"00000001\.key has 31 bytes; at least 32 needed"):
        KeyRing.load(directory)


def test_load_exactly_min_key_bytes(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 1, b"\x01" * 32)
    _write_signer(directory, "00000001")
    assert KeyRing.load(directory).key_ids == (1,)


def test_load_empty_key_file(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    (directory / "00000001.key").write_text("")
    (directory / "00000001.key").chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match="has 0 bytes"):
        KeyRing.load(directory)


@pytest.mark.parametrize("content", ["zz" * 32, "0x" + "00" * 32, "--" * 32,
                                     "00" * 32 + " \n", "00" * 16 + "\n" + "00" * 16 + "\n",
                                     " " + "00" * 32 + "\n", "00" * 32 + "\r\n"])
def test_load_non_hex_key(tmp_path: Path, content: str) -> None:
    directory = _key_dir(tmp_path)
    (directory / "00000001.key").write_text(content)
    (directory / "00000001.key").chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match=r"00000001\.key must hold hex digits only"):
        KeyRing.load(directory)


def test_load_binary_key_file(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    (directory / "00000001.key").write_bytes(b"\xff\xfe" * 40)
    (directory / "00000001.key").chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match=r"00000001\.key must hold hex digits only"):
        KeyRing.load(directory)


def test_load_missing_signer_file(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 1, bytes(32))
    with pytest.raises(KeyDirError,
                       match=r"signing-key-id .No such file or directory.: it names the signing"):
        KeyRing.load(directory)


@pytest.mark.parametrize("text", ["", "1", "0000001", "000000001", "xyz00001", "0x000001"])
def test_load_malformed_signer_file(tmp_path: Path, text: str) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 1, bytes(32))
    _write_signer(directory, text)
    with pytest.raises(KeyDirError, match="must hold 8 hex digits"):
        KeyRing.load(directory)


def test_load_signer_names_missing_key(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 1, bytes(32))
    _write_signer(directory, "0000abcd\n")
    with pytest.raises(KeyDirError) as info:
        KeyRing.load(directory)
    assert str(info.value) == (f"{directory / signing.SIGNER_FILE} names key 0000abcd, but "
                               f"0000abcd.key is not in {directory}")


def test_load_signer_upper_case_accepted(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 0xABCDEF01, bytes(32))
    _write_signer(directory, "ABCDEF01\n")
    assert KeyRing.load(directory).signer == 0xABCDEF01


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o770, 0o777, 0o722])
def test_load_refuses_writable_dir(key_dir: Path, mode: int) -> None:
    key_dir.chmod(mode)
    with pytest.raises(KeyDirError) as info:
        KeyRing.load(key_dir)
    assert "writable by group or others" in str(info.value)
    assert f"mode {mode:o}" in str(info.value)
    assert "chmod 0700" in str(info.value)


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o500])
def test_load_accepts_readable_dir(key_dir: Path, mode: int) -> None:
    key_dir.chmod(mode)
    try:
        assert KeyRing.load(key_dir).key_ids
    finally:
        key_dir.chmod(0o700)


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666, 0o660])
def test_load_refuses_writable_key(key_dir: Path, mode: int) -> None:
    (key_file,) = key_dir.glob("*.key")
    key_file.chmod(mode)
    with pytest.raises(KeyDirError, match=r"\.key is writable by group or others; chmod 0600"):
        KeyRing.load(key_dir)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_load_accepts_owner_only_key(key_dir: Path, mode: int) -> None:
    (key_file,) = key_dir.glob("*.key")
    key_file.chmod(mode)
    assert KeyRing.load(key_dir).key_ids


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604, 0o440])
def test_load_refuses_key_readable_by_others(key_dir: Path, mode: int) -> None:
    """Whoever reads a key can forge handles for every share."""
    (key_file,) = key_dir.glob("*.key")
    key_file.chmod(mode)
    with pytest.raises(KeyDirError) as info:
        KeyRing.load(key_dir)
    assert str(info.value) == (f"key {key_file} is readable by group or others (mode "
                               f"{mode:04o}): anyone who reads it can forge handles; run "
                               f"`chmod 0600 {key_file}`")


def test_keyring_constructor_checks_signer() -> None:
    with pytest.raises(KeyDirError, match="signing key 00000002 is not among the keys"):
        KeyRing({1: bytes(32)}, signer=2)


# --- sign -----------------------------------------------------------------------------------


def test_sign_layout_and_algorithm(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    key = _key_of(key_dir, ring.signer)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert len(f_handle) == len(KERNEL) + sh.TRAILER_SIZE
    assert f_handle[: len(KERNEL)] == KERNEL
    assert f_handle[len(KERNEL): len(KERNEL) + 4] == struct.pack(">I", ring.signer)
    assert f_handle[-16:] == _expected_mac(key, SHARE, HANDLE_TYPE, KERNEL, ring.signer)


def test_sign_known_answer() -> None:
    ring = KeyRing({0x01020304: bytes(range(32))}, signer=0x01020304)
    f_handle = ring.sign(bytes(32), 1, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    expected_mac = _expected_mac(bytes(range(32)), bytes(32), 1,
                                 b"\x01\x02\x03\x04\x05\x06\x07\x08", 0x01020304)
    assert f_handle == (b"\x01\x02\x03\x04\x05\x06\x07\x08\x01\x02\x03\x04" + expected_mac)


def test_sign_is_deterministic(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    handles = {ring.sign(SHARE, HANDLE_TYPE, KERNEL) for _ in range(20)}
    assert len(handles) == 1


def test_sign_depends_on_every_input(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    base = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert ring.sign(OTHER_SHARE, HANDLE_TYPE, KERNEL)[-16:] != base[-16:]
    assert ring.sign(SHARE, HANDLE_TYPE + 1, KERNEL)[-16:] != base[-16:]
    assert ring.sign(SHARE, HANDLE_TYPE, KERNEL[:-1] + b"\x45")[-16:] != base[-16:]


# --- verify ---------------------------------------------------------------------------------


def test_verify_accepts_own_handle(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert ring.verify(SHARE, HANDLE_TYPE, f_handle) == KERNEL


def test_verify_rejects_every_single_bit_flip(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    flips = 0
    for i in range(len(f_handle)):
        for bit in range(8):
            tampered = bytearray(f_handle)
            tampered[i] ^= 1 << bit
            assert ring.verify(SHARE, HANDLE_TYPE, bytes(tampered)) is None, (i, bit)
            flips += 1
    assert flips == 8 * (len(KERNEL) + 20)


def test_verify_rejects_every_truncation(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    for n in range(len(f_handle)):
        assert ring.verify(SHARE, HANDLE_TYPE, f_handle[:n]) is None, n
        assert ring.verify(SHARE, HANDLE_TYPE, f_handle[n + 1:]) is None, n


@pytest.mark.parametrize("extra", [b"\x00", b"\xff", b"\x00" * 4, bytes(range(20)), b"A" * 64])
def test_verify_rejects_extensions(key_dir: Path, extra: bytes) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert ring.verify(SHARE, HANDLE_TYPE, f_handle + extra) is None
    assert ring.verify(SHARE, HANDLE_TYPE, extra + f_handle) is None


def test_verify_rejects_other_share(key_dir: Path) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    for i in range(32):
        for bit in range(8):
            other = bytearray(SHARE)
            other[i] ^= 1 << bit
            assert ring.verify(bytes(other), HANDLE_TYPE, f_handle) is None


@pytest.mark.parametrize("other_type", [HANDLE_TYPE + 1, HANDLE_TYPE - 1, 0, 1, 255, -1,
                                        HANDLE_TYPE | 0x10000, HANDLE_TYPE | 0x20000,
                                        HANDLE_TYPE - 2**31])
def test_verify_rejects_other_handle_type(key_dir: Path, other_type: int) -> None:
    ring = KeyRing.load(key_dir)
    f_handle = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert ring.verify(SHARE, other_type, f_handle) is None


def test_verify_rejects_unknown_key_id(tmp_path: Path) -> None:
    ring = KeyRing({0x11111111: b"\x01" * 32}, 0x11111111)
    stranger = KeyRing({0x22222222: b"\x02" * 32}, 0x22222222)
    # A correctly MAC'd handle, but under a key this ring does not hold.
    foreign = stranger.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert stranger.verify(SHARE, HANDLE_TYPE, foreign) == KERNEL
    assert ring.verify(SHARE, HANDLE_TYPE, foreign) is None
    # Our own MAC, relabelled with a key id we do not know.
    own = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    relabelled = own[: len(KERNEL)] + struct.pack(">I", 0x22222222) + own[-16:]
    assert ring.verify(SHARE, HANDLE_TYPE, relabelled) is None


def test_verify_rejects_same_key_under_other_id() -> None:
    """The key id is MAC'd: a handle cannot be moved to another id even if the key is equal."""
    key = b"\x07" * 32
    ring = KeyRing({1: key, 2: key}, signer=1)
    own = ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    relabelled = own[: len(KERNEL)] + struct.pack(">I", 2) + own[-16:]
    assert ring.verify(SHARE, HANDLE_TYPE, relabelled) is None


def test_verify_rejects_retired_key(key_dir: Path) -> None:
    old_ring = KeyRing.load(key_dir)
    old = old_ring.signer
    handle = old_ring.sign(SHARE, HANDLE_TYPE, KERNEL)
    new = signing.keygen(key_dir)  # becomes the signer
    signing.retire(key_dir, old)
    assert not (key_dir / f"{old:08x}.key").exists()
    new_ring = KeyRing.load(key_dir)
    assert new_ring.key_ids == (new,)
    assert new_ring.verify(SHARE, HANDLE_TYPE, handle) is None
    # The old ring object still verifies: rings are immutable snapshots.
    assert old_ring.verify(SHARE, HANDLE_TYPE, handle) == KERNEL


def test_rotation_old_handles_still_verify(key_dir: Path) -> None:
    ring_a = KeyRing.load(key_dir)
    key_a = ring_a.signer
    handle_a = ring_a.sign(SHARE, HANDLE_TYPE, KERNEL)
    key_b = signing.keygen(key_dir)  # B signs now, A stays for verification
    ring_ab = KeyRing.load(key_dir)
    assert ring_ab.signer == key_b
    assert set(ring_ab.key_ids) == {key_a, key_b}
    assert ring_ab.verify(SHARE, HANDLE_TYPE, handle_a) == KERNEL
    handle_b = ring_ab.sign(SHARE, HANDLE_TYPE, KERNEL)
    assert handle_b[len(KERNEL): len(KERNEL) + 4] == struct.pack(">I", key_b)
    assert handle_b != handle_a
    assert ring_ab.verify(SHARE, HANDLE_TYPE, handle_b) == KERNEL
    assert ring_a.verify(SHARE, HANDLE_TYPE, handle_b) is None  # A-only ring: unknown key


def test_two_rings_from_the_same_dir_are_identical(key_dir: Path, tmp_path: Path) -> None:
    signing.keygen(key_dir)  # two keys
    node1 = KeyRing.load(key_dir)
    node2 = KeyRing.load(key_dir)
    # Another node: the same Secret mounted at another path.
    copy = tmp_path / "elsewhere" / "keys"
    shutil.copytree(key_dir, copy)
    node3 = KeyRing.load(copy)
    for kernel in (KERNEL, b"\x01", bytes(range(108))):
        handles = {r.sign(SHARE, HANDLE_TYPE, kernel) for r in (node1, node2, node3)}
        assert len(handles) == 1
        (handle,) = handles
        for r in (node1, node2, node3):
            assert r.verify(SHARE, HANDLE_TYPE, handle) == kernel


def test_retire_refuses_the_signer(key_dir: Path) -> None:
    signer = KeyRing.load(key_dir).signer
    with pytest.raises(KeyDirError, match=f"key {signer:08x} still signs"):
        signing.retire(key_dir, signer)
    assert (key_dir / f"{signer:08x}.key").exists()
    assert KeyRing.load(key_dir).signer == signer


def test_retire_refuses_the_signer_named_in_upper_case(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    _write_key(directory, 0xABCDEF01, b"\x01" * 32)
    _write_key(directory, 0x12345678, b"\x02" * 32)
    _write_signer(directory, "ABCDEF01\n")
    assert KeyRing.load(directory).signer == 0xABCDEF01
    try:
        with pytest.raises(KeyDirError, match="still signs"):
            signing.retire(directory, 0xABCDEF01)
    finally:
        assert (directory / "abcdef01.key").exists()
        KeyRing.load(directory)


def test_set_signer(key_dir: Path) -> None:
    first = KeyRing.load(key_dir).signer
    second = signing.keygen(key_dir, make_signer=False)
    signing.set_signer(key_dir, second)
    assert KeyRing.load(key_dir).signer == second
    signing.set_signer(key_dir, first)
    assert KeyRing.load(key_dir).signer == first


def test_set_signer_refuses_missing_key(key_dir: Path) -> None:
    with pytest.raises(KeyDirError, match="no key 0badf00d in"):
        signing.set_signer(key_dir, 0x0BADF00D)


# --- property tests -------------------------------------------------------------------------

_RING = KeyRing({0xA: b"\xaa" * 32, 0xB: b"\xbb" * 48}, signer=0xB)
_OLD_RING = KeyRing({0xA: b"\xaa" * 32}, signer=0xA)


@settings(max_examples=300, deadline=None)
@given(share=st.binary(min_size=32, max_size=32), ht=st.integers(-(2**31), 2**31 - 1),
       kernel=st.binary(min_size=1, max_size=sh.MAX_KERNEL_HANDLE_SIZE))
def test_sign_verify_round_trip(share: bytes, ht: int, kernel: bytes) -> None:
    f_handle = _RING.sign(share, ht, kernel)
    assert len(f_handle) == len(kernel) + 20
    assert _RING.verify(share, ht, f_handle) == kernel
    assert _RING.sign(share, ht, kernel) == f_handle
    assert _OLD_RING.verify(share, ht, f_handle) is None
    old_handle = _OLD_RING.sign(share, ht, kernel)
    assert _RING.verify(share, ht, old_handle) == kernel


@settings(max_examples=300, deadline=None)
@given(share=st.binary(min_size=32, max_size=32), ht=st.integers(-(2**31), 2**31 - 1),
       f_handle=st.binary(max_size=160))
def test_verify_random_bytes_never_verify(share: bytes, ht: int, f_handle: bytes) -> None:
    assert _RING.verify(share, ht, f_handle) is None


# --- share ids ------------------------------------------------------------------------------


def test_share_id_from_handle() -> None:
    fs = b"uuid:" + bytes(range(16))
    got = signing.share_id_from_handle(1, b"\x01\x02", fs)
    expected = hashlib.sha256(b"fhmon/share/v2\x00" + bytes([len(fs)]) + fs
                              + b"\x00\x00\x00\x01" + b"\x01\x02").digest()
    assert got == expected
    assert len(got) == sh.SHARE_ID_SIZE
    negative = signing.share_id_from_handle(-2, b"", b"")
    assert negative == hashlib.sha256(b"fhmon/share/v2\x00\x00\xff\xff\xff\xfe").digest()
    assert signing.share_id_from_handle(2, b"\x01\x02", fs) != got
    assert signing.share_id_from_handle(1, b"\x01\x03", fs) != got
    # the same root handle on another filesystem is another share
    assert signing.share_id_from_handle(1, b"\x01\x02", b"uuid:" + bytes(16)) != got
    assert signing.share_id_from_handle(1, b"\x01\x02", b"") != got
    with pytest.raises(ValueError):
        signing.share_id_from_handle(1, b"", b"x" * 256)


# --- what a key directory may hold: regular files only, bounded, complete ---------------------


def _within(seconds: float, action: Any) -> Any:
    """Run action, failing (not hanging) if it blocks: a SIGALRM interrupts the syscall."""
    def expired(*_: Any) -> None:
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return action()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _planted(key_dir: Path, plant: str, name: str) -> Path:
    """Put a hostile entry called `name` into the key directory."""
    path = key_dir / name
    if plant == "fifo":
        os.mkfifo(path, 0o600)
    elif plant == "dev_zero":
        os.symlink("/dev/zero", path)
    elif plant == "directory":
        path.mkdir(mode=0o700)
    elif plant == "oversized":
        path.write_text("00" * (signing.MAX_KEY_FILE_BYTES // 2) + "\n")
        path.chmod(0o600)
    elif plant == "dev_null_node":
        # A device node inside the directory needs mknod (CAP_MKNOD, and no nodev-less user
        # namespace); a link to /dev/null would test the link check instead (dev_zero does).
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD: run the unit suite as root "
                        "to cover a character device planted in the key directory")
    elif plant == "symlink_out":
        outside = key_dir.parent / "outside.key"
        outside.write_text(signing.key_file_text(bytes(range(32))))
        outside.chmod(0o600)
        os.symlink(str(outside), path)
    elif plant == "relative_symlink_out":
        outside = key_dir.parent / "outside.key"
        outside.write_text(signing.key_file_text(bytes(range(32))))
        outside.chmod(0o600)
        os.symlink("../outside.key", path)
    return path


HOSTILE = {"fifo": "a FIFO", "dev_zero": "leads out of the key directory",
           "directory": "a directory",
           "oversized": "more than a key file's", "dev_null_node": "a character device",
           "symlink_out": "leads out of the key directory",
           "relative_symlink_out": "leads out of the key directory"}


@pytest.mark.parametrize("plant", sorted(HOSTILE))
def test_load_refuses_what_is_not_a_small_regular_file(key_dir: Path, plant: str) -> None:
    """A FIFO used to hang open(), /dev/zero to read until MemoryError: now each is refused
    at once, with a message naming it."""
    _planted(key_dir, plant, "0badc0de.key")
    with pytest.raises(KeyDirError, match=HOSTILE[plant]) as info:
        _within(5, lambda: KeyRing.load(key_dir))
    assert "0badc0de.key" in str(info.value)


@pytest.mark.parametrize("plant", ["fifo", "dev_zero", "directory", "oversized"])
def test_load_refuses_a_hostile_signer_file(key_dir: Path, plant: str) -> None:
    (key_dir / signing.SIGNER_FILE).unlink()
    _planted(key_dir, plant, signing.SIGNER_FILE)
    with pytest.raises(KeyDirError, match=HOSTILE[plant]):
        _within(5, lambda: KeyRing.load(key_dir))


def test_load_follows_links_inside_the_directory(tmp_path: Path) -> None:
    """A Secret volume's root: every file is a link into `..data/` (itself a link)."""
    volume = _key_dir(tmp_path, "volume")
    data = volume / "..2026_12_01_00_00_00.000000000"
    data.mkdir(mode=0o700)
    _write_key(data, 0x0A0B0C0D, b"\x07" * 32)
    _write_signer(data, "0a0b0c0d\n")
    os.symlink(data.name, volume / "..data")
    for name in ("0a0b0c0d.key", signing.SIGNER_FILE):
        os.symlink(f"..data/{name}", volume / name)
    assert KeyRing.load(volume).key_ids == (0x0A0B0C0D,)
    assert KeyRing.load(volume / "..data").key_ids == (0x0A0B0C0D,)


def test_legacy_key_files_still_load(tmp_path: Path) -> None:
    """Files written before the check line (one hex line and a newline) keep working."""
    directory = _key_dir(tmp_path)
    for key_id, key in ((1, b"\x01" * 32), (2, b"\x02" * 64)):
        _write_key(directory, key_id, key)
    _write_signer(directory, "00000001")
    ring = KeyRing.load(directory)
    assert ring.key_ids == (1, 2)
    assert ring.sign(SHARE, HANDLE_TYPE, KERNEL) == KeyRing({1: b"\x01" * 32}, 1).sign(
        SHARE, HANDLE_TYPE, KERNEL)


@pytest.mark.parametrize("key_bytes", [32, 64])
@pytest.mark.parametrize("with_check", [True, False], ids=["checked", "legacy"])
def test_a_key_file_cut_anywhere_never_gives_another_key(tmp_path: Path, key_bytes: int,
                                                          with_check: bool) -> None:
    """Every prefix of a key file (what a reader sees while it is written in place) is
    refused, except one that already holds the whole key line (the same key)."""
    directory = _key_dir(tmp_path)
    key = bytes(range(7, 7 + key_bytes))
    text = signing.key_file_text(key) if with_check else key.hex() + "\n"
    _write_signer(directory, "00000001\n")
    path = directory / "00000001.key"
    accepted = []
    for cut in range(len(text) + 1):
        path.write_text(text[:cut])
        path.chmod(0o600)
        try:
            ring = KeyRing.load(directory)
        except KeyDirError as exc:
            assert "00000001.key" in str(exc)
            continue
        assert ring.sign(SHARE, HANDLE_TYPE, KERNEL) == KeyRing({1: key}, 1).sign(
            SHARE, HANDLE_TYPE, KERNEL), f"cut at {cut} gave another key"
        accepted.append(cut)
    whole_line = len(key.hex()) + 1
    assert accepted == ([whole_line, len(text)] if with_check else [len(text)])


def test_a_cut_key_file_says_it_is_incomplete(tmp_path: Path) -> None:
    directory = _key_dir(tmp_path)
    (directory / "00000001.key").write_text("ab" * 40)
    (directory / "00000001.key").chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match=r"incomplete .* write key files atomically"):
        KeyRing.load(directory)


def test_a_key_overwritten_in_place_is_caught_by_its_check(tmp_path: Path) -> None:
    """A new key written over an old one without truncating: the new key line with the old
    check line. Without the check it would be taken for a (wrong) key."""
    directory = _key_dir(tmp_path)
    old, new = b"\x01" * 32, b"\x02" * 32
    path = directory / "00000001.key"
    path.write_text(new.hex() + signing.key_file_text(old)[len(old.hex()):])
    path.chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match="check line does not match"):
        KeyRing.load(directory)


@pytest.mark.parametrize("content,message", [
    ("0" * 65 + "\n", "odd number of hex digits"),
    ("00" * (signing.MAX_KEY_BYTES + 1) + "\n", "at most 1024"),
    ("00" * 32 + "\ncheck " + "0" * 16 + "\n", "check line does not match"),
    ("00" * 32 + "\ncheck " + "0" * 16 + "\nmore\n", "must hold hex digits only"),
    ("00" * 32 + "\ncheck " + "0" * 16, "incomplete"),
])
def test_load_refuses_malformed_key_files(tmp_path: Path, content: str, message: str) -> None:
    directory = _key_dir(tmp_path)
    (directory / "00000001.key").write_text(content)
    (directory / "00000001.key").chmod(0o600)
    _write_signer(directory, "00000001\n")
    with pytest.raises(KeyDirError, match=message):
        KeyRing.load(directory)


def test_load_refuses_more_than_max_keys_before_reading_one(tmp_path: Path) -> None:
    """A documented bound instead of an mlock failure: MAX_KEYS load, one
    more is refused with a message that says what to do; no key file is read then (the
    extra one is not even valid)."""
    directory = _key_dir(tmp_path)
    for n in range(signing.MAX_KEYS):
        _write_key(directory, 0x10000000 + n, bytes([n % 256]) * 32)
    _write_signer(directory, "10000000\n")
    assert len(KeyRing.load(directory).key_ids) == signing.MAX_KEYS
    (directory / "1fffffff.key").write_text("not a key")
    with pytest.raises(KeyDirError, match=f"holds {signing.MAX_KEYS + 1} key files; at most "
                                          f"{signing.MAX_KEYS} are loaded") as info:
        KeyRing.load(directory)
    assert "fhmon key retire" in str(info.value)
