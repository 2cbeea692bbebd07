"""`fhmon status` with many targets.

The status reply was one frame and outgrew the 16 KiB limit at ~70 targets: fhmon dropped
the connection and `fhmon status` failed. Now STATUS is answered in pages (protocol/intake_wire.py
status_page / StatusPages). Here 200 real targets (forked children under the real handle
filter, registered over the real socket) are listed.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator

import pytest

from protocol import intake_wire
from tests.support import FHMON, Service, World
from tests.support.listeners import FilteredChild, registered_children

TARGETS = 200


@pytest.fixture
def many(world: World) -> Iterator[tuple[Service, list[FilteredChild]]]:
    with (Service(world.base, [str(world.shares / "*")], name="status-pages") as service,
          registered_children(service.socket, str(world.main), TARGETS) as children):
        yield service, children


def test_status_lists_two_hundred_targets(many: tuple[Service, list[FilteredChild]]) -> None:
    service, children = many
    res = subprocess.run([FHMON, "status", "--socket", service.socket, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert sorted(t["pid"] for t in status["targets"]) == sorted(c.pid for c in children)
    assert status["total_targets"] == TARGETS
    assert "next" not in status
    text = subprocess.run([FHMON, "status", "--socket", service.socket],
                          capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert sum(line.split()[1:2] in ([str(c.pid)] for c in children)
               for line in text.stdout.splitlines()) == TARGETS
    events = [e.get("event") for e in service.events()]
    assert "connection_failed" not in events


def test_every_status_page_fits_in_a_frame(many: tuple[Service, list[FilteredChild]]) -> None:
    """Ask page by page by hand: each reply a whole frame within MAX_PAYLOAD."""
    service, _ = many
    pages = intake_wire.StatusPages()
    sizes = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(service.socket)
        decoder = intake_wire.FrameDecoder()
        while pages.request is not None:
            sock.sendall(intake_wire.encode(pages.request))
            while (message := decoder.next_message()) is None:
                data = sock.recv(65536)
                assert data, "fhmon closed the connection"
                decoder.feed(data)
            assert isinstance(message, intake_wire.StatusReply)
            sizes.append(len(message.json.encode()))
            pages.feed(message)
    assert len(pages.status["targets"]) == TARGETS
    assert len(sizes) >= 2 and max(sizes) <= intake_wire.MAX_PAYLOAD
