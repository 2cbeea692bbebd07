"""Helpers to read what an agent's call left in its memory."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.agent import Agent

CANARY = 0xA5
TRAILER = 20


@dataclass
class N2HResult:
    ret: int
    errno: int
    handle_bytes: int | None
    handle_type: int | None
    f_handle: bytes
    memory: bytes | None  # the handle buffer as left after the call (header + 160)
    mount_mem: bytes | None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> N2HResult:
        mem = bytes.fromhex(raw["handle_mem"]) if raw.get("handle_mem") else None
        hb = ht = None
        f_handle = b""
        if mem is not None and len(mem) >= 8:
            hb, ht = struct.unpack_from("<Ii", mem, 0)
            if raw["errno"] == 0:
                f_handle = mem[8 : 8 + hb]
        mount = bytes.fromhex(raw["mount_mem"]) if raw.get("mount_mem") else None
        return cls(raw["ret"], raw["errno"], hb, ht, f_handle, mem, mount)

    def written_extent(self) -> int:
        """How many bytes of the handle buffer differ from the canary (last changed + 1)."""
        assert self.memory is not None
        last = -1
        for i, b in enumerate(self.memory):
            if b != CANARY:
                last = i
        return last + 1

    def untouched_from(self, offset: int) -> bool:
        """Whether every byte of the handle buffer from offset on still holds the canary.

        A written byte may equal the canary by chance (a MAC byte is 0xA5 one time in 256),
        so a call that wrote exactly offset bytes is checked this way, not by its extent.
        """
        assert self.memory is not None
        return all(b == CANARY for b in self.memory[offset:])


def signed_handle_args(agent: Agent, path: str) -> dict[str, Any]:
    """The agent's own signed handle for path, as the arguments of its "obh" call."""
    r = N2HResult.of(agent.call("n2h", path=path))
    assert r.errno == 0
    return {"handle_type": r.handle_type, "f_handle": r.f_handle.hex()}


def key_id_of(args: dict[str, Any]) -> str:
    """The id (hex) of the key that signed a handle given as signed_handle_args returns it."""
    return bytes.fromhex(args["f_handle"])[-TRAILER:-TRAILER + 4].hex()
