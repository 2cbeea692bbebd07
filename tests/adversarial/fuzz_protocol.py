"""Coverage-guided fuzzing of the protocol/ parsers with atheris (by hand, never in CI).

    .venv/bin/pip install atheris
    .venv/bin/python tests/adversarial/fuzz_protocol.py -runs=200000      # or -max_total_time=600

The first input byte picks the parser; the rest is its input. A parser may raise only its
documented error (see tests/adversarial/test_fuzz.py, the bounded hypothesis version that CI
runs); anything else is a crash that libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import contextlib
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import atheris

with atheris.instrument_imports():
    from protocol import intake_wire, keeper, kernel, oci, signed_handle


def _native(data: bytes) -> None:
    decoder = intake_wire.FrameDecoder()
    try:
        for start in range(0, len(data), 7):  # also exercise the incremental paths
            decoder.feed(data[start:start + 7])
            while (message := decoder.next_message()) is not None:
                intake_wire.encode(message)
    except intake_wire.ProtocolError:
        pass


def _oci(data: bytes) -> None:
    try:
        state = oci.try_parse(data)
        if state is not None:
            oci.share_from_metadata(state.metadata)
    except oci.OciStateError:
        pass
    reader = oci.StateReader()  # the intake's incremental reader, in chunks of 5
    with contextlib.suppress(oci.OciStateError):
        for start in range(0, len(data), 5):
            if reader.feed(data[start:start + 5]) is not None:
                break
        else:
            reader.finish()


def _metadata(data: bytes) -> None:
    with contextlib.suppress(oci.OciStateError):
        oci.share_from_metadata(data.decode("utf-8", "replace"))


def _keeper(data: bytes) -> None:
    decoder = keeper.Decoder()
    decoder.feed(data)
    try:
        while decoder.next_message() is not None:
            pass
    except keeper.KeeperProtocolError:
        pass


def _kernel(data: bytes) -> None:
    padded = (data + bytes(kernel.SECCOMP_NOTIF_SIZE))[:kernel.SECCOMP_NOTIF_SIZE]
    assert kernel.Notification.parse(padded).pack() == padded
    header = (data + bytes(8))[:8]
    assert kernel.FileHandleHeader.parse(header).pack() == header
    parts = signed_handle.split(data)
    if parts is not None:
        assert signed_handle.assemble(parts.kernel_bytes, parts.key_id, parts.mac) == data
    if len(data) >= 12:
        addr, length = struct.unpack_from("<QI", data)
        ranges = kernel.split_page_ranges(addr, length % (1 << 16))
        assert sum(n for _, n in ranges) == length % (1 << 16)


TARGETS = [_native, _oci, _metadata, _keeper, _kernel]


def test_one_input(data: bytes) -> None:
    if not data:
        return
    TARGETS[data[0] % len(TARGETS)](data[1:])


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
