"""protocol.oci: the runtime's ContainerProcessState, parsed incrementally from a byte buffer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import oci
from protocol.oci import (
    MAX_STATE_SIZE,
    ContainerProcessState,
    OciStateError,
    parse_listener_metadata,
    share_from_metadata,
    try_parse,
    validate,
)

FAST = settings(max_examples=300, deadline=None)
FEWER = settings(max_examples=100, deadline=None)

ANNOTATIONS = {"io.kubernetes.cri.container-type": "sandbox",
               "run.oci.seccomp.receiver": "/run/fhmon/fhmon.sock"}


def _state_dict(oci_version: str = "1.0.2", pid: int = 4422,
                metadata: str = "share=/srv/shares/vm1") -> dict[str, Any]:
    # runc / runtime-spec Go field order.
    return {
        "ociVersion": oci_version,
        "fds": ["seccompFd"],
        "pid": pid,
        "metadata": metadata,
        "state": {"ociVersion": oci_version, "id": "vm1", "status": "creating", "pid": pid,
                  "bundle": "/run/containers/vm1", "annotations": dict(ANNOTATIONS)},
    }


RUNC = json.dumps(_state_dict(), separators=(",", ":")).encode()
EXPECTED = ContainerProcessState("1.0.2", ("seccompFd",), 4422, "share=/srv/shares/vm1", "vm1",
                                 "/run/containers/vm1", dict(ANNOTATIONS))


def _crun(indent: int) -> bytes:
    """crun's get_seccomp_receiver_fd_payload: yajl beautified, ociVersion "0.2.0", and
    its field order: ociVersion, fds, pid, metadata, state{ociVersion, id, status, pid,
    bundle, annotations}; yajl ends the document with a newline."""
    state = _state_dict(oci_version="0.2.0")
    return (json.dumps(state, indent=indent, ensure_ascii=False) + "\n").encode()


CRUN = _crun(2)
CRUN_EXPECTED = ContainerProcessState("0.2.0", ("seccompFd",), 4422, "share=/srv/shares/vm1",
                                      "vm1", "/run/containers/vm1", dict(ANNOTATIONS))


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _with(**changes: Any) -> bytes:
    state = _state_dict()
    for key, value in changes.items():
        if value is _DELETE:
            del state[key]
        else:
            state[key] = value
    return _dump(state)


_DELETE = object()


# --- whole messages -------------------------------------------------------------------------


def test_runc_compact_json() -> None:
    assert RUNC.startswith(b'{"ociVersion":"1.0.2","fds":["seccompFd"],"pid":4422,')
    state = try_parse(RUNC)
    assert state == EXPECTED
    assert state is not None and state.seccomp_fd_index == 0


@pytest.mark.parametrize("indent", [2, 4])
def test_crun_pretty_json(indent: int) -> None:
    raw = _crun(indent)
    assert raw.startswith(b'{\n' + b" " * indent + b'"ociVersion": "0.2.0",\n')
    assert raw.endswith(b"}\n")
    assert try_parse(raw) == CRUN_EXPECTED


def test_crun_layout_is_the_expected_one() -> None:
    text = CRUN.decode()
    keys = [line.strip().split(":")[0] for line in text.splitlines() if '":' in line]
    assert keys[:4] == ['"ociVersion"', '"fds"', '"pid"', '"metadata"']
    assert keys[4:11] == ['"state"', '"ociVersion"', '"id"', '"status"', '"pid"', '"bundle"',
                          '"annotations"']


@pytest.mark.parametrize("raw", [b" \n\t" + RUNC, RUNC + b"\n", RUNC + b" \r\n\t ",
                                 b"\n" + CRUN + b"\n\n"])
def test_surrounding_whitespace(raw: bytes) -> None:
    assert try_parse(raw) is not None


def test_minimal_message() -> None:
    state = try_parse(b'{"ociVersion":"1.0.0","fds":["seccompFd"],"pid":1}')
    assert state == ContainerProcessState("1.0.0", ("seccompFd",), 1, "", "", "", {})


def test_other_fds_and_index() -> None:
    state = try_parse(_with(fds=["pidFd", "seccompFd", "other"]))
    assert state is not None
    assert state.fds == ("pidFd", "seccompFd", "other")
    assert state.seccomp_fd_index == 1


def test_state_pid_may_be_zero_or_null() -> None:
    for pid in (0, None):
        state = _state_dict()
        state["state"]["pid"] = pid
        assert try_parse(_dump(state)) is not None


def test_null_annotations() -> None:
    state = _state_dict()
    state["state"]["annotations"] = None
    parsed = try_parse(_dump(state))
    assert parsed is not None and parsed.annotations == {}


def test_missing_state_object() -> None:
    state = _state_dict()
    del state["state"]
    parsed = try_parse(_dump(state))
    assert parsed is not None
    assert (parsed.container_id, parsed.bundle, parsed.annotations) == ("", "", {})


# --- incremental parsing --------------------------------------------------------------------


@pytest.mark.parametrize("raw", [RUNC, CRUN, _crun(4)], ids=["runc", "crun2", "crun4"])
def test_every_prefix_needs_more(raw: bytes) -> None:
    end = len(raw.rstrip())  # crun's trailing newline is not needed
    for n in range(end):
        assert try_parse(raw[:n]) is None, raw[:n][-20:]
    for n in range(end, len(raw) + 1):
        assert try_parse(raw[:n]) is not None


def test_prefix_with_escaped_quote_and_backslash() -> None:
    raw = _with(metadata='share=/srv/a"b\\c')
    for n in range(len(raw)):
        assert try_parse(raw[:n]) is None, raw[:n][-20:]
    state = try_parse(raw)
    assert state is not None and state.metadata == 'share=/srv/a"b\\c'


def test_prefix_inside_a_unicode_escape_needs_more() -> None:
    state = _state_dict()
    state["state"]["annotations"]["note"] = "a & b"
    raw = json.dumps(state, separators=(",", ":")).replace("&", "\\u0026").encode()
    assert try_parse(raw) is not None  # the whole message is fine
    cut = raw.index(b"\\u0026")
    for n in range(cut, cut + 6):
        assert try_parse(raw[:n]) is None, raw[:n][-12:]


def test_prefix_inside_a_literal_needs_more() -> None:
    state = _state_dict()
    state["state"]["annotations"] = None
    raw = _dump(state)
    assert try_parse(raw) is not None
    cut = raw.index(b"null")
    for n in range(cut, cut + 4):
        assert try_parse(raw[:n]) is None, raw[:n][-12:]


@pytest.mark.parametrize("char", ["\u00e9", "\u4e2d", "\U0001F600"])
def test_multibyte_character_split_at_the_end(char: str) -> None:
    raw = _with(metadata=f"share=/srv/{char}")
    encoded = char.encode()
    start = raw.index(encoded)
    for k in range(1, len(encoded)):  # the partial character is the last thing buffered
        assert try_parse(raw[: start + k]) is None
    state = try_parse(raw)
    assert state is not None and state.metadata == f"share=/srv/{char}"


@pytest.mark.parametrize("partial", [b"\xc3", b"\xe4\xb8", b"\xf0\x9f", b"\xf0\x9f\x98"])
def test_partial_character_alone(partial: bytes) -> None:
    assert try_parse(partial) is None
    assert try_parse(b'{"ociVersion": "' + partial) is None


def test_empty_and_blank_need_more() -> None:
    assert try_parse(b"") is None
    assert try_parse(b"   \n\t") is None


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [b"x", b"{}", b" {", b"\n{\"a\":1}", b"\x00", b"]"])
def test_trailing_bytes(extra: bytes) -> None:
    with pytest.raises(OciStateError, match="bytes after the state message"):
        try_parse(RUNC + extra)


@pytest.mark.parametrize("raw", [b"[]", b'"x"', b"1", b"null", b"x", b"\x00", b"<xml/>"])
def test_not_an_object(raw: bytes) -> None:
    with pytest.raises(OciStateError, match="not a JSON object"):
        try_parse(raw)


@pytest.mark.parametrize("raw", [b"{,", b'{"a" 1', b'{"a":1x', b"{]", b'{"a":]',
                                 b'{"a":"x\\q"}', b"{'a': 1}"])
def test_invalid_json(raw: bytes) -> None:
    with pytest.raises(OciStateError, match="not valid JSON"):
        try_parse(raw)


@pytest.mark.parametrize("fds", [[], ["other"], ["seccompFd", "seccompFd"],
                                 ["a", "seccompFd", "b", "seccompFd"], ["seccompfd"]])
def test_fds_must_name_seccomp_fd_exactly_once(fds: list[str]) -> None:
    with pytest.raises(OciStateError, match="must name 'seccompFd' exactly once"):
        try_parse(_with(fds=fds))


@pytest.mark.parametrize("fds", [_DELETE, "seccompFd", None, {"seccompFd": 0}, 3, [3],
                                 ["seccompFd", None]])
def test_fds_not_a_list_of_strings(fds: Any) -> None:
    with pytest.raises(OciStateError, match="fds missing or not a list of strings"):
        try_parse(_with(fds=fds))


@pytest.mark.parametrize("pid", [_DELETE, 0, -1, -4422, True, False, 2**22 + 1, 2**31,
                                 2**63, 2**64, 1.0, 4422.5, "4422", None, [4422]])
def test_bad_pid(pid: Any) -> None:
    with pytest.raises(OciStateError, match="pid missing or not a positive integer"):
        try_parse(_with(pid=pid))


@pytest.mark.parametrize("pid", [1, 2, 4194303])
def test_good_pid(pid: int) -> None:
    state = try_parse(_dump(_state_dict(pid=pid)))
    assert state is not None and state.pid == pid


def test_state_pid_disagrees() -> None:
    state = _state_dict()
    state["state"]["pid"] = 4423
    with pytest.raises(OciStateError, match=r"state\.pid disagrees with pid"):
        try_parse(_dump(state))


@pytest.mark.parametrize("version", [_DELETE, "", 1, None, ["1.0.2"]])
def test_bad_oci_version(version: Any) -> None:
    with pytest.raises(OciStateError, match="ociVersion missing or not a string"):
        try_parse(_with(ociVersion=version))


@pytest.mark.parametrize("metadata", [1, None, ["share=/a"], {"share": "/a"}])
def test_bad_metadata_type(metadata: Any) -> None:
    with pytest.raises(OciStateError, match="metadata is not a string"):
        try_parse(_with(metadata=metadata))


@pytest.mark.parametrize("state", [[], "running", 1, None])
def test_bad_state_type(state: Any) -> None:
    with pytest.raises(OciStateError, match="state is not an object"):
        try_parse(_with(state=state))


@pytest.mark.parametrize(("key", "value"), [("id", 1), ("bundle", None), ("id", ["x"])])
def test_bad_state_strings(key: str, value: Any) -> None:
    state = _state_dict()
    state["state"][key] = value
    with pytest.raises(OciStateError, match=r"state\.id and state\.bundle must be strings"):
        try_parse(_dump(state))


@pytest.mark.parametrize("annotations", [{"a": 1}, {"a": None}, ["a"], "a=b", {"a": ["b"]}])
def test_bad_annotations(annotations: Any) -> None:
    state = _state_dict()
    state["state"]["annotations"] = annotations
    with pytest.raises(OciStateError, match="annotations must map strings to strings"):
        try_parse(_dump(state))


def test_validate_refuses_non_dict() -> None:
    with pytest.raises(OciStateError, match="not a JSON object"):
        validate([1, 2])


@pytest.mark.parametrize("raw", [b'{"ociVersion": "\xff"}', b"\xff", b"\xfe{",
                                 b'{"a": "\xc3\x28"}', b'{"a": "\xed\xa0\x80"}',
                                 b'{"a": "\xc0\xaf"}', b"\xe2\x28\xa1", RUNC[:20] + b"\x80"])
def test_not_utf8(raw: bytes) -> None:
    with pytest.raises(OciStateError, match="not UTF-8"):
        try_parse(raw)


def test_size_limit() -> None:
    assert MAX_STATE_SIZE == 64 * 1024
    assert try_parse(b" " * MAX_STATE_SIZE) is None
    with pytest.raises(OciStateError, match=f"exceeds {MAX_STATE_SIZE} bytes"):
        try_parse(b" " * (MAX_STATE_SIZE + 1))
    with pytest.raises(OciStateError, match="exceeds"):
        try_parse(RUNC + b" " * (MAX_STATE_SIZE + 1 - len(RUNC)))


def test_message_of_exactly_the_size_limit() -> None:
    state = _state_dict()
    state["state"]["annotations"]["pad"] = ""
    base = len(_dump(state))
    state["state"]["annotations"]["pad"] = "p" * (MAX_STATE_SIZE - base)
    raw = _dump(state)
    assert len(raw) == MAX_STATE_SIZE
    parsed = try_parse(raw)
    assert parsed is not None and len(parsed.annotations["pad"]) == MAX_STATE_SIZE - base


@pytest.mark.parametrize("raw", [b'{"a":' + b"[" * 5000, b'{"a":' + b"[" * 5000 + b"]" * 5000
                                 + b"}", b'{"a":' + b'{"a":' * 3000])
def test_deep_nesting_is_an_oci_state_error(raw: bytes) -> None:
    assert len(raw) < MAX_STATE_SIZE
    with pytest.raises(OciStateError):
        try_parse(raw)


@pytest.mark.parametrize("raw", [b'{"pid":' + b"1" * 5000 + b"}", b'{"pid":' + b"1" * 5000])
def test_huge_integer_is_an_oci_state_error(raw: bytes) -> None:
    with pytest.raises(OciStateError):
        try_parse(raw)


# --- listenerMetadata -----------------------------------------------------------------------


@pytest.mark.parametrize(("metadata", "expected"), [
    ("", {}),
    ("share=/srv/a", {"share": "/srv/a"}),
    ("share=/srv/a;mode=ro", {"share": "/srv/a", "mode": "ro"}),
    ("share=/srv/a\nmode=ro", {"share": "/srv/a", "mode": "ro"}),
    ("share=/srv/a\r\nmode=ro\r\n", {"share": "/srv/a", "mode": "ro"}),
    ("  share = /srv/a  ;\t mode\t=\tro ", {"share": "/srv/a", "mode": "ro"}),
    (";;share=/srv/a;;\n\n", {"share": "/srv/a"}),
    ("share=/srv/a=b", {"share": "/srv/a=b"}),
    ("empty=", {"empty": ""}),
    ("MKNOD=/dev/null,/dev/net/tun;BPF_MAP_TYPES=hash,array",
     {"MKNOD": "/dev/null,/dev/net/tun", "BPF_MAP_TYPES": "hash,array"}),
])
def test_parse_listener_metadata(metadata: str, expected: dict[str, str]) -> None:
    assert parse_listener_metadata(metadata) == expected


@pytest.mark.parametrize("metadata", ["share=/a;share=/b", "share=/a\nshare=/a",
                                      " share=/a ; share =/b"])
def test_metadata_duplicate_keys(metadata: str) -> None:
    with pytest.raises(OciStateError, match="listenerMetadata has 'share' twice"):
        parse_listener_metadata(metadata)


@pytest.mark.parametrize(("metadata", "entry"), [("share", "share"),
                                                 ("share=/a;ro", "ro"),
                                                 ("=/srv/a", "=/srv/a"),
                                                 (" = x", "= x"),
                                                 ("/srv/a", "/srv/a")])
def test_metadata_entries_without_key_value(metadata: str, entry: str) -> None:
    with pytest.raises(OciStateError) as info:
        parse_listener_metadata(metadata)
    assert str(info.value) == f"listenerMetadata entry {entry!r} is not key=value"


@pytest.mark.parametrize(("metadata", "share"), [("share=/srv/a", "/srv/a"),
                                                 ("mode=ro; share = /srv/b ", "/srv/b"),
                                                 ("share=/", "/")])
def test_share_from_metadata(metadata: str, share: str) -> None:
    assert share_from_metadata(metadata) == share


@pytest.mark.parametrize("metadata", ["", "mode=ro", "share=", "share=  ", "shares=/a"])
def test_share_missing(metadata: str) -> None:
    with pytest.raises(OciStateError, match="listenerMetadata has no share=/path entry"):
        share_from_metadata(metadata)


@pytest.mark.parametrize("share", ["srv/a", "./srv", "~/srv", "../srv"])
def test_share_must_be_absolute(share: str) -> None:
    with pytest.raises(OciStateError, match=f"share {share!r} must be an absolute path"):
        share_from_metadata(f"share={share}")


# --- property tests -------------------------------------------------------------------------

_PLAIN_TEXT = st.text(st.characters(exclude_categories=["Cs", "Cc"]), max_size=30)


@st.composite
def _valid_states(draw: st.DrawFn) -> tuple[dict[str, Any], ContainerProcessState]:
    version = draw(st.sampled_from(["1.0.2", "0.2.0", "1.2.0"]))
    others = draw(st.lists(_PLAIN_TEXT.filter(lambda f: f != oci.SECCOMP_FD_NAME), max_size=3))
    index = draw(st.integers(0, len(others)))
    fds = [*others[:index], oci.SECCOMP_FD_NAME, *others[index:]]
    pid = draw(st.integers(1, 2**22 - 1))
    metadata = draw(_PLAIN_TEXT)
    container_id = draw(_PLAIN_TEXT)
    bundle = draw(_PLAIN_TEXT)
    annotations = draw(st.dictionaries(_PLAIN_TEXT, _PLAIN_TEXT, max_size=3))
    value = {"ociVersion": version, "fds": fds, "pid": pid, "metadata": metadata,
             "state": {"ociVersion": version, "id": container_id, "status": "creating",
                       "pid": pid, "bundle": bundle, "annotations": annotations}}
    expected = ContainerProcessState(version, tuple(fds), pid, metadata, container_id, bundle,
                                     annotations)
    return value, expected


@FEWER
@given(case=_valid_states(), indent=st.sampled_from([None, 2, 4]))
def test_generated_states_parse_and_every_prefix_needs_more(
        case: tuple[dict[str, Any], ContainerProcessState], indent: int | None) -> None:
    value, expected = case
    separators = (",", ":") if indent is None else None
    raw = json.dumps(value, indent=indent, separators=separators, ensure_ascii=False).encode()
    assert try_parse(raw) == expected
    for n in range(len(raw)):
        assert try_parse(raw[:n]) is None


def _check_only_oci_errors(raw: bytes) -> None:
    try:
        result = try_parse(raw)
    except OciStateError:
        return
    assert result is None or isinstance(result, ContainerProcessState)


@FAST
@given(raw=st.binary(max_size=400))
def test_arbitrary_bytes_only_raise_oci_state_error(raw: bytes) -> None:
    _check_only_oci_errors(raw)


_TOKENS = [b"{", b"}", b"[", b"]", b":", b",", b'"', b" ", b"\n", b"\\", b"\\u",
           b"\\u00", b"0", b"1", b"-", b"1e", b"null", b"nu", b"true", b"false",
           b'"ociVersion"', b'"fds"', b'"seccompFd"', b'"pid"', b'"metadata"', b'"state"',
           b'"annotations"', b"4422", "\u00e9".encode(), b"\xff", b"\xc3", b"\x00"]


@FAST
@given(tokens=st.lists(st.sampled_from(_TOKENS), max_size=60))
def test_json_like_input_only_raises_oci_state_error(tokens: list[bytes]) -> None:
    _check_only_oci_errors(b"".join(tokens))


@FEWER
@given(case=_valid_states(), data=st.data())
def test_mutated_states_only_raise_oci_state_error(
        case: tuple[dict[str, Any], ContainerProcessState], data: st.DataObject) -> None:
    raw = bytearray(_dump(case[0]))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    _check_only_oci_errors(bytes(raw))
    _check_only_oci_errors(bytes(raw[: data.draw(st.integers(0, len(raw)))]))


# --- StateReader: the intake's incremental reader --------------------------------------

def _outcome(parse: Any) -> object:
    try:
        return parse()
    except oci.OciStateError as exc:
        return ("error", str(exc))


def _read(chunks: list[bytes]) -> object:
    """What the reader gives for `chunks` of one connection that then ends."""
    reader = oci.StateReader()
    for chunk in chunks:
        try:
            state = reader.feed(chunk)
        except oci.OciStateError as exc:
            return ("error", str(exc))
        if state is not None:
            return state
    return ("error", str(reader.finish()))


def _whole(raw: bytes) -> object:
    """What try_parse gives for the whole message (None: cut short)."""
    state = _outcome(lambda: oci.try_parse(raw))
    return ("error", "connection closed before a whole state message arrived") \
        if state is None else state


SAMPLES = [RUNC, CRUN, _crun(4), RUNC + b"\n", b"  " + CRUN, RUNC[:-1], RUNC + b"x",
           b"[1]", b'{"a": nul', _with(pid=-1), _with(fds=[]), b'{"x":"\\u12',
           _dump({**_state_dict(), "annotations": {"j": '{"nested": "}"}'}})]


@FEWER
@given(st.sampled_from(SAMPLES), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_reader_in_any_chunks_answers_as_the_whole_message(raw: bytes, cuts: list[int]) -> None:
    points = sorted({c % (len(raw) + 1) for c in cuts} - {0})
    chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert _read([c for c in chunks if c]) == _whole(raw)


@pytest.mark.parametrize("raw", [RUNC, CRUN])
def test_reader_answers_on_the_chunk_that_completes_the_message(raw: bytes) -> None:
    reader = oci.StateReader()
    assert reader.feed(raw[:-7]) is None
    assert reader.feed(raw[-7:]) == oci.try_parse(raw)


def test_a_byte_at_a_time_after_60kb_costs_no_parse_until_it_can_end() -> None:
    """Found (issue 37.2): every byte re-parsed the whole buffer. Now 4,000 bytes after a
    60 KB first chunk cost no parse unless the buffer ends in `}` or has doubled."""
    head = b'{"ociVersion":"1.0.2","fds":["seccompFd"],"pid":1,"metadata":"'
    reader = oci.StateReader()
    assert reader.add(head + b"a" * 60_000) > 0  # the first chunk is parsed
    assert reader.parse() is None
    assert [reader.add(b"a") for _ in range(4000)] == [0] * 4000
    assert reader.parses == 1
    cost = reader.add(b'"}')  # may be whole now: a parse, priced by its size
    assert cost == 1 + len(reader) // oci.StateReader.PARSE_UNIT
    state = reader.parse()
    assert state is not None and state.metadata == "a" * (60_000 + 4000)


def test_a_malformed_message_is_refused_once_its_buffer_doubles() -> None:
    reader = oci.StateReader()
    assert reader.feed(b'{"ociVersion": "1.0.2", "x": "' + b"a" * 100) is None
    reader.feed(b'", "y": bad ')  # not yet parsed: no `}`, not doubled
    with pytest.raises(oci.OciStateError, match="not valid JSON"):
        reader.feed(b" " * 200)


def test_reader_refuses_past_the_size_limit() -> None:
    reader = oci.StateReader()
    reader.add(b"{" + b" " * (oci.MAX_STATE_SIZE - 1))
    with pytest.raises(oci.OciStateError, match="exceeds"):
        reader.add(b" ")


def test_finish_names_the_messages_own_error() -> None:
    reader = oci.StateReader()
    reader.add(b'{"ociVersion": "1.0.2", "fds": "x", ')  # not parsed after the first chunk
    reader.parse()
    reader.add(b"a" * 10)
    assert "not valid JSON" in str(reader.finish())
