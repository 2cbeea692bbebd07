"""protocol/worker.py: the messages between fhmon serve and its workers, without sockets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import worker as wire
from protocol.share import ShareFacts

NAMES = st.text(min_size=1, max_size=40)
COUNTS = st.integers(0, 2**40)


def share(**kw: object) -> ShareFacts:
    values: dict[str, object] = {"mount_id": 2**40 + 7, "dev": 2049, "ino": 12,
                                 "share_id": bytes(range(32)), "host_path": "/srv/é/a",
                                 "target_path": "/a", "is_mount_root": False}
    values.update(kw)
    return ShareFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("message", [
    wire.Start("/etc/fhmon/keys", True, "info", True, False),
    wire.Start("/k", False, "debug", False, True, data_plane="python", data_plane_threads=4),
    wire.Start("/k", True, "info", True, True, pidfds_per_target=16),
    wire.AddTarget(3, 4242, 4240, 0, 0, "native", share()),
    wire.AddTarget(2**31, 1, 1, 65534, 65534, "oci", share(is_mount_root=True, share_id=b"")),
    wire.AddTarget(5, 6, 7, 0, 0, "native", share(is_mount_root=True, whole_fs=True)),
    wire.RemoveTarget(3),
    wire.ReloadKeys(),
    wire.Ready(),
    wire.Report(),
])
def test_round_trip(message: wire.Message) -> None:
    assert wire.decode(wire.encode(message)) == message


@given(results=st.dictionaries(st.tuples(NAMES, NAMES), COUNTS, max_size=8),
       seconds=st.dictionaries(NAMES, st.floats(0, 1e6), max_size=4),
       refusals=st.dictionaries(NAMES, COUNTS, max_size=4),
       calls=st.dictionaries(st.integers(1, 2**31), COUNTS, max_size=4),
       buckets=st.dictionaries(st.sampled_from(["name_to_handle_at", "open_by_handle_at"]),
                               st.lists(COUNTS, min_size=17, max_size=17), max_size=2))
def test_report_round_trip(results: dict[tuple[str, str], int], seconds: dict[str, float],
                           refusals: dict[str, int], calls: dict[int, int],
                           buckets: dict[str, list[int]]) -> None:
    report = wire.decode(wire.encode(wire.Report(results, seconds, refusals, calls, buckets)))
    assert report == wire.Report(results, seconds, refusals, calls, buckets)


def test_a_busy_report_stays_small() -> None:
    """Latencies travel as bucket counts: a report's size does not grow with its calls."""
    buckets = {"name_to_handle_at": [10**12] * 17, "open_by_handle_at": [10**12] * 17}
    data = wire.encode(wire.Report(buckets=buckets))
    assert len(data) < 1024


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[]", b'{"op": "nope"}', b'{"op": "start"}',
    b'{"op": "start", "key_dir": 1, "signing": true, "log_level": "info",'
    b' "drop_capabilities": true, "sandbox": false}',
    b'{"op": "start", "key_dir": "/k", "signing": 1, "log_level": "info",'
    b' "drop_capabilities": true, "sandbox": false}',
    b'{"op": "start", "key_dir": "/k", "signing": true, "log_level": "info",'
    b' "drop_capabilities": true, "sandbox": false}',
    b'{"op": "start", "key_dir": "/k", "signing": true, "log_level": "info",'
    b' "drop_capabilities": true, "sandbox": false, "data_plane": "inline",'
    b' "data_plane_threads": 1}',
    b'{"op": "start", "key_dir": "/k", "signing": true, "log_level": "info",'
    b' "drop_capabilities": true, "sandbox": false, "data_plane": "native",'
    b' "data_plane_threads": 1, "pidfds_per_target": 0}',
    b'{"op": "report", "results": [["a", "b", true]], "seconds": {}, "refusals": {},'
    b' "calls": [], "buckets": {}}',
    b'{"op": "report", "results": [], "seconds": {}, "refusals": {}, "calls": [],'
    b' "buckets": {"a": [1.5]}}',
    b'{"op": "report", "results": [], "seconds": {}, "refusals": {}, "calls": [],'
    b' "buckets": {"a": [-1]}}',
    b'{"op": "report", "results": [], "seconds": {}, "refusals": {}, "calls": [],'
    b' "samples": {}}',
])
def test_malformed_messages_are_refused(body: bytes) -> None:
    with pytest.raises(wire.WorkerProtocolError):
        wire.decode(body)


def test_add_target_with_a_bad_share_id_is_refused() -> None:
    body = json.loads(wire.encode(wire.AddTarget(1, 2, 3, 0, 0, "native", share())))
    body["share"]["share_id"] = "zz"
    with pytest.raises(wire.WorkerProtocolError):
        wire.decode(json.dumps(body).encode())
