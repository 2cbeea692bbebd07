"""Layout of the handles fhmon hands out: the kernel's handle followed by a MAC trailer.

    f_handle = kernel_f_handle || key_id (u32, big endian) || mac (16 bytes)

handle_type stays the kernel's, so virtiofsd and the kernel's own type checks see what they
expect. The MAC covers a domain tag, the share id, the type, the kernel bytes and the key id;
it never covers host paths, mount ids or anything node-local, so a handle verifies after a
monitor restart and on another node that shares the key.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from protocol.kernel import MAX_HANDLE_SZ

KEY_ID_SIZE: Final = 4
MAC_SIZE: Final = 16  # 128-bit truncated HMAC-SHA256
TRAILER_SIZE: Final = KEY_ID_SIZE + MAC_SIZE
MAX_KERNEL_HANDLE_SIZE: Final = MAX_HANDLE_SZ - TRAILER_SIZE
SHARE_ID_SIZE: Final = 32
DOMAIN_TAG: Final = b"fhmon/handle/v1\0"

_KEY_ID = struct.Struct(">I")
_TYPE_LEN = struct.Struct(">iI")


@dataclass(frozen=True, slots=True)
class SignedHandle:
    kernel_bytes: bytes
    key_id: int
    mac: bytes


def mac_message(share_id: bytes, handle_type: int, kernel_bytes: bytes, key_id: int) -> bytes:
    """The exact bytes the MAC is computed over (fixed-width fields, no ambiguity)."""
    return mac_prefix(share_id) + mac_suffix(handle_type, kernel_bytes, key_id)


def mac_prefix(share_id: bytes) -> bytes:
    """The part of the message that only depends on the share (hashed once per share)."""
    if len(share_id) != SHARE_ID_SIZE:
        raise ValueError("share id must be 32 bytes")
    return DOMAIN_TAG + share_id


def mac_suffix(handle_type: int, kernel_bytes: bytes, key_id: int) -> bytes:
    return _TYPE_LEN.pack(handle_type, len(kernel_bytes)) + kernel_bytes + _KEY_ID.pack(key_id)


def assemble(kernel_bytes: bytes, key_id: int, mac: bytes) -> bytes:
    if len(mac) != MAC_SIZE:
        raise ValueError("mac must be 16 bytes")
    return kernel_bytes + _KEY_ID.pack(key_id) + mac


def split(f_handle: bytes) -> SignedHandle | None:
    """Split a presented f_handle; None when it cannot be one of ours (too short)."""
    if len(f_handle) <= TRAILER_SIZE:
        return None
    kernel_bytes = f_handle[:-TRAILER_SIZE]
    (key_id,) = _KEY_ID.unpack_from(f_handle, len(kernel_bytes))
    return SignedHandle(kernel_bytes, key_id, f_handle[-MAC_SIZE:])
