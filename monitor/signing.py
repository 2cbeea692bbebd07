"""The only module that touches key material: loading keys, signing and verifying handles.

Keys live in a directory (as mounted from a Kubernetes Secret): `<8 hex digits>.key` holds
at least 32 random bytes as hex, and `signing-key-id` names the key that signs. Every key
present verifies; removing a key file retires it.

A key file is valid only when complete (docs/operations.md, "Key files"): one line of hex
digits ending in a newline, optionally followed by `check <16 hex digits>` and a newline (the
first 8 bytes of SHA-256 over a fixed label and the key, which `fhmon keygen` writes). A file
caught half-written in place lacks the final newline (or its check line is cut, or does not
match what was mixed in); it is refused and the ring in use stays. Entries are opened without
following symlinks out of the directory and without blocking, and only regular files of at
most MAX_KEY_FILE_BYTES are read: a FIFO, a device, a directory or a link to /dev/zero is
refused with a message, never waited on or read without bound.
"""

from __future__ import annotations

import errno
import hashlib
import hmac as std_hmac
import os
import re
import secrets
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import hmac as crypto_hmac

from monitor import linux
from protocol import kernel, signed_handle

MIN_KEY_BYTES: Final = 32
MAX_KEY_BYTES: Final = 1024  # far above any real key; bounds what a key file may hold
MAX_KEY_FILE_BYTES: Final = 4096  # larger entries are refused unread
# A rotation needs two or three keys. The native plane locks each key's state in a page of
# its own (mlock, counted against RLIMIT_MEMLOCK once capabilities are dropped), and a reload
# holds the old ring and the new one: 256 keys are 1 MiB locked, 2 MiB during a reload. A
# directory with more is refused before a key is read (20,000 keys made the lock fail).
MAX_KEYS: Final = 256
KEY_CHECK_LABEL: Final = b"fhmon/key-check/v1\0"
_KEY_FILE = re.compile(rb"([0-9a-fA-F]+)\n(?:check ([0-9a-f]{16})\n)?")
# what a valid key file looks like while it is still being written (cut anywhere)
_KEY_FILE_PREFIX = re.compile(
    rb"[0-9a-fA-F]+(?:\n(?:c(?:h(?:e(?:c(?:k(?: [0-9a-f]{0,16})?)?)?)?)?)?)?")
_SIGNER_TEXT = re.compile(rb"[0-9a-fA-F]{8}\n?")
SIGNER_FILE: Final = "signing-key-id"
_KEY_NAME = re.compile(r"^([0-9a-f]{8})\.key$")
_TYPE_LEN = struct.Struct(">iI")  # signed_handle.mac_suffix's header
_KEY_ID_SIZE: Final = signed_handle.KEY_ID_SIZE
_MAC_SIZE: Final = signed_handle.MAC_SIZE
_TRAILER_SIZE: Final = signed_handle.TRAILER_SIZE
_MAX_SHARES_CACHED: Final = 4096


class KeyDirError(Exception):
    """The key directory cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: int
    signing: bool


class KeyRing:
    """An immutable set of keys; reloading builds a new ring and swaps it in atomically."""

    def __init__(self, keys: dict[int, bytes], signer: int) -> None:
        if signer not in keys:
            raise KeyDirError(f"signing key {signer:08x} is not among the keys")
        self._macs = {kid: self._keyed(key) for kid, key in keys.items()}
        self._native: Any = None  # the same keys in the native plane's locked memory
        self._native_keys = dict(keys)
        # key id (4 bytes, as in a handle) -> share id -> keyed state with the prefix absorbed
        self._states: dict[bytes, dict[bytes, crypto_hmac.HMAC]] = {
            kid.to_bytes(_KEY_ID_SIZE, "big"): {} for kid in keys}
        self.signer = signer
        self._signer_bytes = signer.to_bytes(_KEY_ID_SIZE, "big")
        self._signer_states = self._states[self._signer_bytes]

    @staticmethod
    def _keyed(key: bytes) -> crypto_hmac.HMAC:
        return crypto_hmac.HMAC(key, hashes.SHA256())

    def native(self) -> Any:
        """This ring as a monitor._native.KeyRing (built once, on first use: only the
        native data plane needs it); the Python copy of the key bytes is dropped then."""
        if self._native is None:
            from monitor import _native

            self._native = _native.KeyRing(self._native_keys, self.signer)
            self._native_keys = {}
        return self._native

    @property
    def key_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._macs))

    def _prefixed_state(self, key_id_bytes: bytes, share_id: bytes) -> crypto_hmac.HMAC:
        """The keyed state of a known key (by its 4 id bytes) with the per-share prefix
        absorbed: built on a share's first handle, then looked up inline by sign/verify."""
        states = self._states[key_id_bytes]
        if len(states) >= _MAX_SHARES_CACHED:
            states.clear()
        prefixed = self._macs[int.from_bytes(key_id_bytes, "big")].copy()
        prefixed.update(signed_handle.mac_prefix(share_id))
        states[share_id] = prefixed
        return prefixed

    # sign and verify run on every call, hence inlined: the message is
    # signed_handle.mac_message(), the result signed_handle.assemble() (the unit tests
    # check both against these), and each looks its state up in two dicts.

    def sign(self, share_id: bytes, handle_type: int, kernel_bytes: bytes) -> bytes:
        """The f_handle to give a target: kernel bytes + key id + MAC (deterministic)."""
        key_id_bytes = self._signer_bytes
        prefixed = self._signer_states.get(share_id)
        if prefixed is None:
            prefixed = self._prefixed_state(key_id_bytes, share_id)
        h = prefixed.copy()
        h.update(_TYPE_LEN.pack(handle_type, len(kernel_bytes)) + kernel_bytes + key_id_bytes)
        return kernel_bytes + key_id_bytes + h.finalize()[:_MAC_SIZE]

    def verify(self, share_id: bytes, handle_type: int, f_handle: bytes) -> bytes | None:
        """The kernel bytes if the MAC is right for this share and a known key, else None."""
        n = len(f_handle) - _TRAILER_SIZE
        if n <= 0:
            return None
        signed_part = f_handle[: n + _KEY_ID_SIZE]  # the kernel bytes, then the key id
        key_id_bytes = signed_part[n:]
        states = self._states.get(key_id_bytes)
        if states is None:
            return None  # an unknown (or retired) key
        prefixed = states.get(share_id)
        if prefixed is None:
            prefixed = self._prefixed_state(key_id_bytes, share_id)
        h = prefixed.copy()
        h.update(_TYPE_LEN.pack(handle_type, n) + signed_part)
        if not std_hmac.compare_digest(h.finalize()[:_MAC_SIZE], f_handle[n + _KEY_ID_SIZE :]):
            return None
        return signed_part[:n]

    @classmethod
    def load(cls, key_dir: str | Path) -> KeyRing:
        directory = Path(key_dir)
        try:
            st = directory.stat()
        except OSError as exc:
            raise KeyDirError(f"key directory {directory}: {exc.strerror}; "
                              f"create one with `fhmon keygen --key-dir {directory}`") from None
        if not stat.S_ISDIR(st.st_mode):
            raise KeyDirError(f"key directory {directory} is not a directory")
        if st.st_mode & 0o022 and not _read_only_mount(directory):
            raise KeyDirError(f"key directory {directory} is writable by group or others "
                              f"(mode {st.st_mode & 0o777:o}); chmod 0700 it")
        try:
            dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise KeyDirError(f"cannot open key directory {directory}: {exc.strerror}") from None
        try:
            return cls._load_from(directory, dir_fd)
        finally:
            os.close(dir_fd)

    @classmethod
    def _load_from(cls, directory: Path, dir_fd: int) -> KeyRing:
        keys: dict[int, bytes] = {}
        try:
            entries = sorted(os.listdir(dir_fd))
        except OSError as exc:
            raise KeyDirError(f"cannot list key directory {directory}: {exc.strerror}") from None
        named = [(entry, match) for entry in entries if (match := _KEY_NAME.match(entry))]
        if len(named) > MAX_KEYS:
            raise KeyDirError(f"key directory {directory} holds {len(named)} key files; "
                              f"at most {MAX_KEYS} are loaded (docs/operations.md): retire "
                              f"the keys no handle in use needs (`fhmon key retire`)")
        for entry, match in named:
            keys[int(match.group(1), 16)] = _read_key(directory, dir_fd, entry)
        if not keys:
            raise KeyDirError(f"no keys (<8 hex digits>.key) in {directory}; "
                              f"run `fhmon keygen --key-dir {directory}`")
        signer_path = directory / SIGNER_FILE
        raw, _ = _read_entry(directory, dir_fd, SIGNER_FILE, "it names the signing key id")
        if not _SIGNER_TEXT.fullmatch(raw):
            raise KeyDirError(f"{signer_path} must hold 8 hex digits, not "
                              f"{raw[:40].decode(errors='replace')!r}")
        signer = int(raw.strip(), 16)
        if signer not in keys:
            raise KeyDirError(f"{signer_path} names key {signer:08x}, but "
                              f"{signer:08x}.key is not in {directory}")
        return cls(keys, signer)

    def describe(self) -> list[KeyInfo]:
        return [KeyInfo(kid, kid == self.signer) for kid in self.key_ids]


def key_check(key: bytes) -> str:
    """The check line's digits: detects a key file that is cut or mixed, not an attacker."""
    return hashlib.sha256(KEY_CHECK_LABEL + key).hexdigest()[:16]


def key_file_text(key: bytes) -> str:
    """What `fhmon keygen` writes: the key, then its check line."""
    return f"{key.hex()}\ncheck {key_check(key)}\n"


_FILE_TYPES = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFDIR: "a directory",
               stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symlink"}


def _read_entry(directory: Path, dir_fd: int, name: str,
                purpose: str = "") -> tuple[bytes, os.stat_result]:
    """The bytes of one regular file of the key directory, read without blocking and
    without bound problems: symlinks are followed only inside the directory (a Secret
    volume's `..data` links), and anything but a regular file of at most
    MAX_KEY_FILE_BYTES is refused before a byte is read."""
    path = directory / name
    why = f": {purpose}" if purpose else ""
    resolve = kernel.RESOLVE_BENEATH | kernel.RESOLVE_NO_MAGICLINKS
    try:
        probe = linux.openat2(dir_fd, name.encode(), os.O_PATH | os.O_CLOEXEC, resolve)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise KeyDirError(f"refusing {path}: a symlink that leads out of the key "
                              f"directory") from None
        raise KeyDirError(f"cannot read {path} ({exc.strerror}){why}") from None
    try:
        _check_regular(path, os.fstat(probe))
        fd = linux.openat2(dir_fd, name.encode(),
                           os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, resolve)
    except OSError as exc:
        raise KeyDirError(f"cannot read {path} ({exc.strerror}){why}") from None
    finally:
        os.close(probe)
    try:
        st = os.fstat(fd)
        _check_regular(path, st)  # it may have been swapped since the probe
        data = b""
        while len(data) <= MAX_KEY_FILE_BYTES:
            chunk = os.read(fd, MAX_KEY_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise KeyDirError(f"cannot read {path} ({exc.strerror}){why}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyDirError(f"refusing {path}: it grew past {MAX_KEY_FILE_BYTES} bytes")
    return data, st


def _check_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _FILE_TYPES.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise KeyDirError(f"refusing {path}: it is {kind}, not a regular file")
    if st.st_size > MAX_KEY_FILE_BYTES:
        raise KeyDirError(f"refusing {path}: {st.st_size} bytes, more than a key file's "
                          f"{MAX_KEY_FILE_BYTES}")


def _read_key(directory: Path, dir_fd: int, name: str) -> bytes:
    path = directory / name
    data, st = _read_entry(directory, dir_fd, name)
    if st.st_mode & 0o022 and not _read_only_mount(directory):
        raise KeyDirError(f"key {path} is writable by group or others; chmod 0600 it")
    _refuse_readable_by_others(path, st)
    if not data.strip():
        raise KeyDirError(f"key {path} has 0 bytes (empty, or being written: write key "
                          f"files atomically, see docs/operations.md)")
    match = _KEY_FILE.fullmatch(data)
    if match is None:
        if _KEY_FILE_PREFIX.fullmatch(data):
            raise KeyDirError(f"key {path} is incomplete (no final newline): being written "
                              f"in place? write key files atomically (docs/operations.md)")
        raise KeyDirError(f"key {path} must hold hex digits only (one line, then an "
                          f"optional `check` line)")
    digits, check = match.group(1), match.group(2)
    if len(digits) % 2:
        raise KeyDirError(f"key {path} has an odd number of hex digits")
    key = bytes.fromhex(digits.decode())
    if len(key) < MIN_KEY_BYTES:
        raise KeyDirError(f"key {path} has {len(key)} bytes; at least {MIN_KEY_BYTES} needed")
    if len(key) > MAX_KEY_BYTES:
        raise KeyDirError(f"key {path} has {len(key)} bytes; at most {MAX_KEY_BYTES}")
    if check is not None and not std_hmac.compare_digest(check.decode(), key_check(key)):
        raise KeyDirError(f"key {path}: its check line does not match the key (a cut or "
                          f"mixed file, e.g. overwritten in place): refusing it")
    return key


def _refuse_readable_by_others(path: Path, st: os.stat_result) -> None:
    """A key anyone else can read lets them forge handles: only the owner may read it.
    (A Kubernetes Secret volume gets this with defaultMode: 0400.)"""
    if st.st_mode & 0o044:
        raise KeyDirError(f"key {path} is readable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}): anyone who reads it can forge "
                          f"handles; run `chmod 0600 {path}`")


def _read_only_mount(path: Path) -> bool:
    """A read-only mount (a Kubernetes Secret volume) cannot be written whatever its modes."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def keygen(key_dir: str | Path, *, make_signer: bool = True) -> int:
    """Add a fresh random key; by default make it the signer. Returns its id."""
    directory = Path(key_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    existing = {int(m.group(1), 16) for e in os.listdir(directory) if (m := _KEY_NAME.match(e))}
    while True:
        key_id = secrets.randbits(32)
        if key_id and key_id not in existing:
            break
    _write_atomically(directory / f"{key_id:08x}.key",
                      key_file_text(secrets.token_bytes(MIN_KEY_BYTES)))
    if make_signer:
        set_signer(directory, key_id)
    return key_id


def set_signer(key_dir: str | Path, key_id: int) -> None:
    directory = Path(key_dir)
    if not (directory / f"{key_id:08x}.key").exists():
        raise KeyDirError(f"no key {key_id:08x} in {directory}")
    _write_atomically(directory / SIGNER_FILE, f"{key_id:08x}\n")


def retire(key_dir: str | Path, key_id: int) -> None:
    directory = Path(key_dir)
    signer = (directory / SIGNER_FILE).read_text().strip()
    if re.fullmatch(r"[0-9a-fA-F]{8}", signer) and int(signer, 16) == key_id:
        raise KeyDirError(f"key {key_id:08x} still signs; switch the signer first")
    (directory / f"{key_id:08x}.key").unlink()


def share_id_from_handle(handle_type: int, kernel_bytes: bytes, filesystem: bytes) -> bytes:
    """A share's identity: a hash of its filesystem's identity (the superblock UUID, else
    the statfs fsid: see policy.filesystem_identity) and of its root directory's handle.
    Both are node- and path-independent, so a handle verifies on every node that mounts
    the same filesystem; the filesystem part keeps two filesystem roots apart (every ext4
    root is inode 2, generation 0: the root handle alone does not name a filesystem)."""
    from cryptography.hazmat.primitives.hashes import SHA256, Hash

    if len(filesystem) > 255:
        raise ValueError("filesystem identity too long")
    digest = Hash(SHA256())
    digest.update(b"fhmon/share/v2\0" + bytes([len(filesystem)]) + filesystem
                  + handle_type.to_bytes(4, "big", signed=True) + kernel_bytes)
    return digest.finalize()
