"""Fuzzing: hypothesis property tests over every protocol/ parser, and over the live paths.

Each parser may only answer with its documented error (ProtocolError, OciStateError,
KeeperProtocolError, ValueError for wrong-size kernel structs, None for a handle that cannot
be fhmon's); anything else (a KeyError, a RecursionError, an IndexError...) would reach the
service as an unexpected exception. The live tests send random frames to the real socket
and random handles and paths to a real target under fhmon. Budgets are bounded (CI); the
atheris harness `tests/adversarial/fuzz_protocol.py` runs the same targets unbounded.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import intake_wire, keeper, kernel, oci, signed_handle
from tests.adversarial.common import FUZZING, O_PATH, errname, signed, warm
from tests.adversarial.recording import Recorder
from tests.support import Agent, Service, World
from tests.support.listeners import send_raw


def budget(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


def run_property(record: Recorder, what: str, expected: str,
                 prop: Callable[[], None], counter: list[int]) -> None:
    try:
        prop()
    except Exception as exc:  # the falsifying example, as hypothesis reports it
        record(FUZZING, what, expected, f"{type(exc).__name__}: {str(exc)[:160]}", ok=False)
        raise
    record(FUZZING, f"{what} ({counter[0]} inputs)", expected, expected)


# --- protocol/intake_wire.py ----------------------------------------------------------------------

def native_frames() -> st.SearchStrategy[bytes]:
    payload = st.binary(max_size=300)
    header = st.builds(lambda v, k, n: intake_wire.MAGIC + struct.pack(">HHI", v, k, n),
                       st.sampled_from([1, 1, 1, 0, 2, 0xFFFF]), st.integers(0, 10),
                       st.integers(0, 400))
    framed = st.builds(lambda k, p: intake_wire.MAGIC + struct.pack(">HHI", 1, k, len(p)) + p,
                       st.integers(0, 10), payload)
    return st.one_of(st.binary(max_size=400), framed, st.builds(bytes.__add__, header, payload))


def test_native_decoder(record: Recorder) -> None:
    seen = [0]

    @budget(600)
    @given(data=native_frames(), cuts=st.lists(st.integers(0, 420), max_size=4))
    def prop(data: bytes, cuts: list[int]) -> None:
        seen[0] += 1
        decoder = intake_wire.FrameDecoder()
        bounds = sorted({0, len(data), *[c for c in cuts if c < len(data)]})
        try:
            for start, end in itertools.pairwise(bounds):
                decoder.feed(data[start:end])
                while (message := decoder.next_message()) is not None:
                    again = intake_wire.decode_one(intake_wire.encode(message))
                    if not (isinstance(message, intake_wire.Refuse) and len(message.reason) > 4000):
                        assert again == message
        except intake_wire.ProtocolError:
            pass

    run_property(record, "native frames: random bytes, random and well-formed headers with "
                 "random payloads, fed in random chunks", "messages that re-encode to "
                 "themselves, or ProtocolError", prop, seen)


# --- protocol/oci.py ------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
STATE_KEYS = ["ociVersion", "fds", "pid", "metadata", "state", "id", "bundle", "annotations"]


def oci_like() -> st.SearchStrategy[bytes]:
    fields = st.dictionaries(st.sampled_from(STATE_KEYS), JSON | st.just(["seccompFd"])
                             | st.integers(-5, 2**23), max_size=6)
    states = fields.map(lambda d: json.dumps(d).encode())
    deep = st.integers(1, 5000).map(lambda n: b'{"a":' + b"[" * n)
    return st.one_of(st.binary(max_size=300), states, deep,
                     states.flatmap(lambda s: st.integers(0, len(s)).map(lambda i: s[:i])))


def _read_in_chunks(data: bytes, chunk: int) -> oci.ContainerProcessState | None:
    reader = oci.StateReader()
    try:
        for start in range(0, len(data), chunk):
            if (state := reader.feed(data[start:start + chunk])) is not None:
                return state
    except oci.OciStateError:
        return None
    return None


def _every_prefix(data: bytes, chunk: int) -> oci.ContainerProcessState | None:
    try:
        for end in range(chunk, len(data) + chunk, chunk):
            if (state := oci.try_parse(data[:end])) is not None:
                return state
    except oci.OciStateError:
        return None
    return None


def test_oci_state_parser(record: Recorder) -> None:
    seen = [0]

    @budget(600)
    @given(data=oci_like(), chunk=st.integers(1, 64))
    def prop(data: bytes, chunk: int) -> None:
        seen[0] += 1
        try:
            state = oci.try_parse(data)
        except oci.OciStateError:
            state = None
        # the intake's StateReader, fed in chunks, accepts exactly the state that parsing
        # every prefix at the same chunk boundaries (the intake before issue 37.2) accepts,
        # and refuses (for whichever reason it sees first) what that refuses
        assert _read_in_chunks(data, chunk) == _every_prefix(data, chunk)
        if state is not None:
            assert state.pid > 0 and state.fds.count(oci.SECCOMP_FD_NAME) == 1
            assert isinstance(state.metadata, str)

    run_property(record, "OCI ContainerProcessState: random bytes, random JSON objects with "
                 "the state's keys, truncations, 5,000-deep nesting; also fed in chunks to "
                 "the intake's StateReader", "a valid state, None (incomplete), or "
                 "OciStateError; the chunked reader ends as the whole parse does", prop, seen)


def test_oci_metadata_parser(record: Recorder) -> None:
    seen = [0]
    alphabet = st.sampled_from([*"share=/;\n\r \t=ab.\0", "share", "=", "/x"])

    @budget(600)
    @given(text=st.one_of(st.text(max_size=80), st.lists(alphabet, max_size=20).map("".join)))
    def prop(text: str) -> None:
        seen[0] += 1
        try:
            entries = oci.parse_listener_metadata(text)
            assert all(k and k == k.strip() for k in entries)
            share = oci.share_from_metadata(text)
        except oci.OciStateError:
            return
        assert share.startswith("/")

    run_property(record, "OCI listenerMetadata (key=value;...): random text", "entries and "
                 "an absolute share, or OciStateError", prop, seen)


# --- protocol/keeper.py ------------------------------------------------------------------------

def test_keeper_decoder(record: Recorder) -> None:
    seen = [0]
    body = st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode()),
                     st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n))
    framed = body.map(lambda b: struct.pack(">I", len(b)) + b)

    @budget(400)
    @given(data=st.one_of(st.binary(max_size=300), framed,
                          st.lists(framed, max_size=3).map(b"".join)))
    def prop(data: bytes) -> None:
        seen[0] += 1
        decoder = keeper.Decoder()
        decoder.feed(data)
        try:
            while (message := decoder.next_message()) is not None:
                assert isinstance(message, dict) and isinstance(message["op"], str)
        except keeper.KeeperProtocolError:
            pass

    run_property(record, "keeper frames: random bytes, random JSON, deep nesting",
                 "objects with an op, or KeeperProtocolError", prop, seen)


# --- protocol/kernel.py and protocol/signed_handle.py --------------------------------------------

def test_kernel_structs_and_signed_handles(record: Recorder) -> None:
    seen = [0]

    @budget(600)
    @given(notif=st.binary(min_size=0, max_size=100), header=st.binary(max_size=12),
           f_handle=st.binary(max_size=kernel.MAX_HANDLE_SZ + 8),
           htype=st.integers(-2**31, 2**31 - 1), addr=st.integers(0, 2**64 - 1),
           length=st.integers(-10, 3 * 4096), reg=st.integers(0, 2**64 - 1))
    def prop(notif: bytes, header: bytes, f_handle: bytes, htype: int, addr: int, length: int,
             reg: int) -> None:
        seen[0] += 1
        try:
            parsed = kernel.Notification.parse(notif)
            assert parsed.pack() == notif
        except ValueError:
            assert len(notif) != kernel.SECCOMP_NOTIF_SIZE
        try:
            assert kernel.FileHandleHeader.parse(header).pack() == header
        except ValueError:
            assert len(header) != 8
        valid = kernel.handle_type_is_valid(htype)
        assert valid == (htype >= 0 and not (htype & 0xFFFF0000 & ~0x30000))
        parts = signed_handle.split(f_handle)
        if len(f_handle) <= signed_handle.TRAILER_SIZE:
            assert parts is None
        else:
            assert parts is not None
            assert signed_handle.assemble(parts.kernel_bytes, parts.key_id,
                                          parts.mac) == f_handle
        ranges = kernel.split_page_ranges(addr, length)
        assert sum(n for _, n in ranges) == max(0, length)
        assert all(a // 4096 == (a + n - 1) // 4096 for a, n in ranges)
        assert -2**31 <= kernel.arg_int(reg) < 2**31

    run_property(record, "seccomp_notif, file_handle header, handle types, signed-handle "
                 "split, page ranges, syscall int args: random inputs", "exact round trips, "
                 "or ValueError for a wrong size", prop, seen)


def test_signatures_never_verify_a_random_or_altered_handle(record: Recorder,
                                                            tmp_path: Path) -> None:
    from monitor import signing

    signing.keygen(tmp_path / "keys")
    ring = signing.KeyRing.load(tmp_path / "keys")
    share = os.urandom(32)
    seen = [0]

    @budget(500)
    @given(kernel_bytes=st.binary(min_size=1, max_size=108), htype=st.integers(0, 2**31 - 1),
           noise=st.binary(max_size=128), flip=st.integers(0, 8 * 128 - 1),
           other_share=st.binary(min_size=32, max_size=32))
    def prop(kernel_bytes: bytes, htype: int, noise: bytes, flip: int,
             other_share: bytes) -> None:
        seen[0] += 1
        good = ring.sign(share, htype, kernel_bytes)
        assert ring.verify(share, htype, good) == kernel_bytes
        altered = bytearray(good)
        altered[(flip // 8) % len(good)] ^= 1 << (flip % 8)
        assert ring.verify(share, htype, bytes(altered)) is None
        assert ring.verify(share, htype, noise) is None
        if other_share != share:
            assert ring.verify(other_share, htype, good) is None
        assert ring.verify(share, htype ^ 1, good) is None

    run_property(record, "MAC verification: random handles, one-bit alterations, other "
                 "shares, other types", "verify only the unaltered signed handle", prop, seen)


# --- live: the real socket, a real target ---------------------------------------------------------

def test_random_frames_at_the_socket(fhmon: Service, record: Recorder) -> None:
    seen = [0]
    odd: list[str] = []

    @budget(60)
    @given(data=st.one_of(native_frames(), oci_like()))
    def prop(data: bytes) -> None:
        seen[0] += 1
        reply = send_raw(fhmon.socket, data, close_write=True, timeout=5)
        if reply:
            try:
                message = intake_wire.decode_one(reply)
            except intake_wire.ProtocolError as exc:
                odd.append(f"undecodable reply {reply[:20]!r}: {exc}")
                return
            if not isinstance(message,
                              intake_wire.Refuse | intake_wire.Pong | intake_wire.StatusReply):
                odd.append(f"unexpected {type(message).__name__}")
        assert fhmon.proc is not None and fhmon.proc.poll() is None

    run_property(record, "random frames and OCI states at the live socket", "nothing, or one "
                 "REFUSE/PONG/STATUS_REPLY frame; fhmon keeps running", prop, seen)
    assert not odd, odd


def test_random_handles_at_a_live_target(spawn: Any, record: Recorder) -> None:
    agent: Agent = spawn()
    warm(agent)
    htype, good = signed(agent, "dir/inner")
    seen = [0]
    wrongly_opened: list[str] = []

    @budget(150)
    @given(f_handle=st.one_of(st.binary(min_size=1, max_size=140), st.just(good),
                              st.builds(lambda i, b: good[:i] + bytes([b]) + good[i + 1:],
                                        st.integers(0, len(good) - 1), st.integers(0, 255))),
           hb=st.one_of(st.none(), st.sampled_from([0, 1, 20, 21, 128, 129, 2**31, 2**32 - 1])),
           handle_type=st.one_of(st.just(htype), st.integers(-2**31, 2**31 - 1)),
           flags=st.sampled_from([0, 1, 2, O_PATH, 0o200000, 0o1000, 0o2000000]))
    def prop(f_handle: bytes, hb: int | None, handle_type: int, flags: int) -> None:
        seen[0] += 1
        kw: dict[str, Any] = {} if hb is None else {"handle_bytes": hb}
        out = agent.call("obh", handle_type=handle_type, f_handle=f_handle.hex(), flags=flags,
                         **kw)
        genuine = f_handle == good and handle_type == htype and hb in (None, len(good))
        if out["errno"] == 0 and not genuine:
            wrongly_opened.append(f"{f_handle.hex()} type {handle_type} hb {hb}")
        assert out["errno"] != -1, out  # the agent saw an impossible fd number

    run_property(record, "random, mutated and genuine handles with random handle_bytes, "
                 "handle_type and flags at a live target", "only the genuine handle opens",
                 prop, seen)
    assert not wrongly_opened, wrongly_opened


COMPONENTS = ["file", "dir", "deep", "inner", "leaf", "link_in", "link_deep", "link_out",
              "link_abs", "loop_a", "link_dir", "fifo", "null", "readonly", "rootonly",
              "noexec", "hidden", "emptydir", "missing", "..", ".", "", "hardlink_out", "proc",
              "self", "root", "cwd", "etc", "outside", "secret", "shares", "other", "sub",
              "main", "thread-self", "fd", "0", "3"]


def test_random_paths_at_a_live_target(spawn: Any, world: World, record: Recorder) -> None:
    agent: Agent = spawn()
    inside = {(st_.st_dev, st_.st_ino) for st_ in
              [os.lstat(world.main)] + [os.lstat(Path(d) / n) for d, dirs, files in
                                         os.walk(world.main) for n in dirs + files]}
    seen = [0]
    outside: list[str] = []
    answers: dict[str, int] = {}

    @budget(200)
    @given(parts=st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=8),
           absolute=st.booleans(), follow=st.booleans())
    def prop(parts: list[str], absolute: bool, follow: bool) -> None:
        seen[0] += 1
        path = ("/" if absolute else "") + "/".join(parts)
        out = agent.call("n2h", path=path, flags=0x400 if follow else 0)
        name = errname(out["errno"])
        answers[name] = answers.get(name, 0) + 1
        if out["errno"] != 0:
            return
        mem = bytes.fromhex(out["handle_mem"])
        hb, ht = struct.unpack_from("<Ii", mem)
        opened = agent.call("obh", handle_type=ht, f_handle=mem[8:8 + hb].hex(), flags=O_PATH)
        if opened["errno"] == 0 and (opened["dev"], opened["ino"]) not in inside:
            outside.append(f"{path} -> {opened['path']}")
        elif opened["errno"] not in (0, errno.EACCES):
            outside.append(f"{path}: its handle gives {errname(opened['errno'])}")

    run_property(record, "random paths from share, host and /proc names, '..', symlinks, "
                 "absolute or not, followed or not, at a live target", "every handle obtained "
                 "names an inode inside the share", prop, seen)
    assert not outside, outside
