"""What an operator sees: Prometheus metrics, JSON logs with an audit trail, status, config."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import FHMON, Agent, Service, World, wait_until
from tests.support.handles import N2HResult


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()) and (
                head == name or head.startswith(name + "{")):
            return float(value)
    raise AssertionError(f"no {name} {labels} in metrics")


def test_metrics_logs_and_status(world: World) -> None:
    port = free_port()
    with Service(world.base, [str(world.shares / "*")], name="observed",
                 extra=["--metrics-address", f"127.0.0.1:{port}"]) as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            h = N2HResult.of(agent.call("n2h", path="file"))
            for _ in range(10):
                agent.call("obh", handle_type=h.handle_type, f_handle=h.f_handle.hex())
            agent.call("obh", handle_type=h.handle_type, f_handle=(b"\0" * 28).hex())
            agent.call("n2h", path="../../outside/secret")
            agent.call("n2h", path="missing")
            url = f"http://127.0.0.1:{port}/metrics"
            scraped: list[str] = []

            def counted() -> bool:  # with worker processes, counts arrive with their reports
                scraped.append(urllib.request.urlopen(url, timeout=5).read().decode())
                try:
                    return metric(scraped[-1], "fhmon_calls_total", syscall="name_to_handle_at",
                                  result="ENOENT") >= 1
                except AssertionError:
                    return False

            wait_until(counted, timeout=5)
            text = scraped[-1]
            assert metric(text, "fhmon_calls_total", syscall="name_to_handle_at", result="ok") >= 1
            assert metric(text, "fhmon_calls_total", syscall="open_by_handle_at", result="ok") >= 10
            assert metric(text, "fhmon_calls_total", syscall="name_to_handle_at",
                          result="ENOENT") >= 1
            assert metric(text, "fhmon_mac_failures_total") >= 1
            assert metric(text, "fhmon_confinement_refusals_total", reason="outside_share") >= 1
            assert "_created" not in text
            assert metric(text, "fhmon_build_info") == 1
            assert metric(text, "fhmon_key_info", signer="true") == 1
            assert metric(text, "fhmon_targets") == 1
            assert metric(text, "fhmon_call_duration_seconds_bucket", syscall="open_by_handle_at",
                          le="5e-05") >= 0
            assert metric(text, "fhmon_open_fds") > 0
            assert metric(text, "fhmon_registrations_total", outcome="accepted") == 1

            status = subprocess.run([FHMON, "status", "--socket", service.socket],
                                    capture_output=True, text=True, check=True).stdout
            assert str(agent.pid) in status and str(world.main) in status

            lines = service.log_text().splitlines()
            events = [json.loads(line) for line in lines]  # every line is one JSON object
            audit = [e for e in events if e.get("audit")]
            reasons = {e["reason"] for e in audit}
            assert {"bad or foreign MAC", "object outside the share"} <= reasons  # human text
            assert {"mac_invalid", "outside_share"} <= {e["code"] for e in audit}  # as in metrics
            for e in audit:
                assert {"tid", "tgid", "share", "syscall", "errno"} <= set(e), e
        finally:
            agent.close()


def test_config_file_validation_and_print_config(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('socket = "/run/x/fhmon.sock"\nkey_dir = "/etc/k"\nallow = ["/srv/*"]\n'
                    'socket_mode = "0660"\nsocket_group = 0\n')
    out = subprocess.run([FHMON, "serve", "--config", str(good), "--log-level", "debug",
                          "--print-config"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 'socket_mode = "0660"' in out.stdout and 'log_level = "debug"' in out.stdout
    cases: dict[str, Any] = {
        'sockt = "/x"\n': "unknown config key 'sockt'",
        'socket = 5\n': "config key 'socket': expected str",
        'socket_mode = "0666"\n': "lets any local user connect",
        'allow = ["relative/*"]\n': "must be an absolute glob",
        'log_level = "chatty"\n': "config key 'log_level'",
        "this is not toml": "not valid TOML",
    }
    for body, words in cases.items():
        bad = tmp_path / "bad.toml"
        bad.write_text(body)
        out = subprocess.run([FHMON, "serve", "--config", str(bad), "--print-config"],
                             capture_output=True, text=True)
        assert out.returncode == 2 and words in out.stderr, (body, out.stderr)


def test_fhmon_keeps_only_the_capabilities_it_needs(fhmon: Service) -> None:
    status = Path(f"/proc/{fhmon.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    kept = {2, 5, 6, 7, 19}  # DAC_READ_SEARCH, KILL, SETGID, SETUID, SYS_PTRACE
    expected = sum(1 << c for c in kept)
    assert int(fields["CapEff"], 16) == expected
    assert int(fields["CapPrm"], 16) == expected
    assert int(fields["CapBnd"], 16) == expected
    events = [e for e in fhmon.events() if e.get("event") == "capabilities"]
    assert events and sorted(events[0]["kept"]) == sorted(
        ["CAP_DAC_READ_SEARCH", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_PTRACE"])


def test_sandboxed_fhmon_serves_under_its_own_filter(world: World) -> None:
    with Service(world.base, [str(world.shares / "*")], name="sandboxed",
                 extra=["--sandbox"]) as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        try:
            h = N2HResult.of(agent.call("n2h", path="dir/inner"))
            assert h.errno == 0
            assert agent.call("obh", handle_type=h.handle_type,
                              f_handle=h.f_handle.hex())["errno"] == 0
            status = Path(f"/proc/{service.pid}/status").read_text()
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            assert fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1"
            assert any(e.get("event") == "sandbox" and e["rules"] > 100 for e in service.events())
        finally:
            agent.close()


def test_socket_activation(world: World, tmp_path: Path) -> None:
    """systemd hands fhmon a listening socket as fd 3 (LISTEN_FDS=1): fhmon serves on it and
    leaves it in place when it stops (systemd owns it)."""
    path = str(tmp_path / "activated.sock")
    tmp_path.chmod(0o755)
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(path)
    listening.listen(16)
    fd = listening.fileno()
    keys = tmp_path / "keys"
    subprocess.run([FHMON, "keygen", "--key-dir", str(keys)], check=True, capture_output=True)
    # what systemd does between fork and exec: the socket as fd 3, LISTEN_PID = own pid
    launcher = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.close(int(sys.argv[1])); "
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
                "os.execv(sys.argv[2], sys.argv[2:])")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-c", launcher, str(fd), FHMON, "serve",
                             "--socket", path, "--key-dir", str(keys), "--allow",
                             f"{world.shares}/*"], pass_fds=(fd,), stdout=log, stderr=log)
    listening.close()
    try:
        agent = Agent(world, "fhmon", world.main, path)
        try:
            assert agent.call("n2h", path="file")["errno"] == 0
        finally:
            agent.close()
        text = (tmp_path / "serve.log").read_text()
        assert '"event":"socket_activated"' in text
    finally:
        proc.send_signal(15)
        assert proc.wait(timeout=10) == 0
        log.close()
    assert os.path.exists(path)  # systemd's socket stays for the next start


def reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends an RST instead of a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_metrics_endpoint_survives_resets_and_broken_clients(world: World) -> None:
    """One connection's error stays that connection's: resets at every point of a request,
    half-closed sockets and garbage never stop fhmon serve, which keeps answering calls
    and scrapes."""
    port = free_port()
    with Service(world.base, [str(world.shares / "*")], name="resets",
                 extra=["--metrics-address", f"127.0.0.1:{port}"]) as service:
        agent = Agent(world, "fhmon", world.main, service.socket)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        try:
            for _ in range(30):
                reset(socket.create_connection(("127.0.0.1", port)))  # RST before a byte
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(request[:10])  # RST mid-request
                reset(s)
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(request)  # RST while fhmon writes its answer
                reset(s)
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(request)
                s.recv(1)  # RST after fhmon began to answer
                reset(s)
                with socket.create_connection(("127.0.0.1", port)) as s:  # half-closed, no request
                    s.shutdown(socket.SHUT_WR)
                    s.settimeout(10)
                    s.recv(100)
                with socket.create_connection(("127.0.0.1", port)) as s:  # garbage
                    s.sendall(bytes(range(256)) * 4 + b"\r\n\r\n")
                    s.settimeout(10)
                    with contextlib.suppress(OSError):
                        s.recv(100)
            assert service.proc is not None and service.proc.poll() is None, service.log_text()
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            assert b"fhmon_targets 1.0" in text
            assert agent.call("n2h", path="file")["errno"] == 0
        finally:
            agent.close()


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_readyz_says_why_fhmon_cannot_take_targets(world: World, tmp_path: Path) -> None:
    """/healthz: the process answers. /readyz: 200 only while the keys loaded without error
    and the intake accepts; else 503 and the reason (without paths: the details are in the
    log). Made to fail for real: a broken key file appears in the key directory (the watcher
    reloads), then the intake is filled to its connection cap."""
    port = free_port()
    config = tmp_path / "readyz.toml"
    config.write_text("max_connections = 2\n")
    with Service(world.base, [str(world.shares / "*")], name="readyz",
                 extra=["--metrics-address", f"127.0.0.1:{port}",
                        "--config", str(config)]) as service:
        broken = service.key_dir / "0badc0de.key"
        try:
            assert http_get(port, "/readyz") == (200, "ready\n")
            assert http_get(port, "/healthz") == (200, "ok\n")
            broken.write_text("not hex\n")
            broken.chmod(0o600)
            assert wait_until(lambda: http_get(port, "/readyz")[0] == 503, timeout=10)
            status, reason = http_get(port, "/readyz")
            assert status == 503
            assert reason.startswith("key directory: the last load failed"), reason
            assert str(service.key_dir) not in reason
            assert http_get(port, "/healthz") == (200, "ok\n")  # alive, and old keys still serve
            assert any(e.get("event") == "keys_reload_failed" and "0badc0de" in e["error"]
                       for e in service.events())
            broken.unlink()
            assert wait_until(lambda: http_get(port, "/readyz") == (200, "ready\n"), timeout=10)
            held = [socket.socket(socket.AF_UNIX) for _ in range(2)]
            try:
                for s in held:
                    s.connect(service.socket)
                assert wait_until(lambda: http_get(port, "/readyz")[0] == 503, timeout=10)
                assert http_get(port, "/readyz")[1] == "intake at its connection cap\n"
            finally:
                for s in held:
                    s.close()
            assert wait_until(lambda: http_get(port, "/readyz") == (200, "ready\n"), timeout=10)
            assert http_get(port, "/readyz?verbose=1")[0] == 200
            assert http_get(port, "/ready")[0] == 404
        finally:
            broken.unlink(missing_ok=True)


def test_keeper_metrics_count_deposits_and_restores(world: World) -> None:
    """With a keeper configured: fhmon_keeper_deposits_total{outcome} and
    fhmon_keeper_restored_total, made by a real keeper, a restart, and a keeper gone."""
    keeper_path = str(world.base / "metrics-keeper.sock")
    keeper = subprocess.Popen([FHMON, "keeper", "--socket", keeper_path],
                              stderr=subprocess.DEVNULL)
    assert wait_until(lambda: os.path.exists(keeper_path), timeout=15)
    port = free_port()
    service = Service(world.base, [str(world.shares / "*")], name="keeper-metrics",
                      extra=["--keeper", keeper_path, "--metrics-address", f"127.0.0.1:{port}"])
    agents: list[Agent] = []

    def scraped() -> str:
        return http_get(port, "/metrics")[1]

    try:
        agents.append(Agent(world, "runc", world.main, service.socket))
        assert agents[0].call("n2h", path="file")["errno"] == 0
        assert wait_until(lambda: metric(scraped(), "fhmon_keeper_deposits_total",
                                         outcome="ok") == 1)
        assert metric(scraped(), "fhmon_keeper_deposits_total", outcome="failed") == 0
        service.stop(signal.SIGKILL)
        service.start()  # takes the listener back from the keeper
        assert metric(scraped(), "fhmon_keeper_restored_total") == 1
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(timeout=10)
        agents.append(Agent(world, "runc", world.main, service.socket))
        assert agents[1].call("n2h", path="file")["errno"] == 0
        assert wait_until(lambda: metric(scraped(), "fhmon_keeper_deposits_total",
                                         outcome="failed") == 1)
    finally:
        for agent in agents:
            agent.close()
        if keeper.poll() is None:
            keeper.kill()
            keeper.wait()
        service.stop()


def test_status_counts_every_answered_call_of_a_target(world: World, fhmon: Service) -> None:
    """STATUS's per-target `calls` counts the calls either data plane answered (the native
    plane answers these ones itself, the reference none of them), flushed when asked."""
    agent = Agent(world, "fhmon", world.main, fhmon.socket)
    try:
        h = N2HResult.of(agent.call("n2h", path="file"))
        assert h.errno == 0
        for _ in range(5):
            assert agent.call("obh", handle_type=h.handle_type,
                              f_handle=h.f_handle.hex())["errno"] == 0
        assert agent.call("n2h", path="missing")["errno"] == errno.ENOENT

        def mine() -> list[dict[str, Any]]:
            return [t for t in fhmon.status()["targets"] if t["pid"] == agent.pid]

        # a native call is counted just after its answer reached the target
        assert wait_until(lambda: [t["calls"] for t in mine()] == [7], timeout=5), mine()
    finally:
        agent.close()
