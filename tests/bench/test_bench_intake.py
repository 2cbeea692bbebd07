"""bench.intake's noise from bench/noise.c: it sends the bytes the Python clients send (a
listening socket of this test reads them), and a short bench run against fhmon, beside
noise.c's sink, answers every victim call."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import intake
from tests.support.world import REPO


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return intake.compile_noise(tmp_path_factory.mktemp("noise"))


def _listen(tmp_path: Path) -> tuple[socket.socket, str]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp_path / "s.sock")
    server.bind(path)
    server.listen(16)
    server.settimeout(5)
    return server, path


def _read_for(conn: socket.socket, seconds: float) -> bytes:
    conn.settimeout(0.05)
    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = conn.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        got += data
    return got


def test_oci_noise_is_the_prefix_then_a_byte_a_millisecond(noise: Path, tmp_path: Path) -> None:
    server, path = _listen(tmp_path)
    proc = subprocess.Popen(intake.c_noise_argv(noise, "oci", path, 1))
    try:
        conn, _ = server.accept()
        got = _read_for(conn, 0.5)
    finally:
        proc.terminate()
        proc.wait(5)
    assert got.startswith(intake.OCI_PREFIX)
    dribbled = got[len(intake.OCI_PREFIX):]
    assert set(dribbled) == {ord("a")}
    assert 50 <= len(dribbled) <= 520, len(dribbled)  # ~1 a ms for 0.5 s, never a burst


def test_slow_noise_dribbles_all_but_the_last_byte_then_reconnects(noise: Path,
                                                                    tmp_path: Path) -> None:
    server, path = _listen(tmp_path)
    hello = intake.SLOW_HELLO
    proc = subprocess.Popen(intake.c_noise_argv(noise, "slow", path, 1))
    try:
        first, _ = server.accept()
        got = _read_for(first, 5 * 0.005 * len(hello) + 1)
        second, _ = server.accept()  # it came back once it had sent all but the last byte
        second.close()
    finally:
        proc.terminate()
        proc.wait(5)
    assert got == hello[:-1]


def test_pipelined_noise_writes_pings_and_waits_for_answers(noise: Path, tmp_path: Path) -> None:
    server, path = _listen(tmp_path)
    proc = subprocess.Popen(intake.c_noise_argv(noise, "pipelined", path, 1))
    try:
        conn, _ = server.accept()
        conn.settimeout(5)
        burst = b""
        while len(burst) < len(intake.PING_BURST):
            burst += conn.recv(1 << 20)
        assert burst == intake.PING_BURST
        assert _read_for(conn, 0.3) == b""  # no second burst before the answers came
        conn.sendall(b"x" * intake.PONG_BYTES)
        conn.settimeout(5)
        assert conn.recv(1 << 20).startswith(intake.PING_BURST[:64])
    finally:
        proc.terminate()
        proc.wait(5)


def test_sink_reads_and_discards(noise: Path, tmp_path: Path) -> None:
    path = tmp_path / "sink.sock"
    sink = intake.Sink(path, None, noise)
    try:
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        for client in clients:
            client.connect(str(path))
            client.settimeout(5)
            client.sendall(b"z" * (4 << 20))  # more than a socket buffer: someone reads it
            client.close()
    finally:
        sink.stop()


def test_bench_intake_runs_beside_the_sink(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.intake", "--reps", "1", "--calls",
                           "500", "--as-uid", "65534", "--kinds", "pipelined,slow,oci",
                           "--kind-clients", "oci=10", "--clients", "2", "--sink"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["generator"] == "c"
    for kind in ("alone", "pipelined", "slow", "oci"):
        assert report["this"][kind]["p99_us"] > 0, kind
    for kind in ("slow", "oci"):
        assert report["sink"][kind]["p99_ratio"] > 0, kind
