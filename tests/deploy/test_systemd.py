"""The systemd units: the service and socket agree with each other and with the DaemonSet,
`systemd-analyze verify`, and the documented install run for real.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.deploy.checks import check_unit
from tests.deploy.flags import parse_flags, serve_flags
from tests.deploy.render import DEPLOY, REPO, SERVICE_UNIT
from tests.deploy.steps import doc_block, rust_build_env


def test_systemd_unit(unit: configparser.ConfigParser, daemonset: dict[str, Any]) -> None:
    assert check_unit(unit, daemonset) == []
    service = unit["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["RuntimeDirectory"] == "fhmon"
    assert shlex.split(service["ExecStartPre"])[1:2] == ["check"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_socket_unit_matches_the_service(unit: configparser.ConfigParser) -> None:
    socket_unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    socket_unit.optionxform = str  # type: ignore[assignment,method-assign]
    socket_unit.read_string((DEPLOY / "systemd" / "fhmon.socket").read_text())
    serve = shlex.split(unit["Service"]["ExecStart"])
    assert socket_unit["Socket"]["ListenStream"] == serve[serve.index("--socket") + 1]
    assert socket_unit["Socket"]["SocketMode"] == serve[serve.index("--socket-mode") + 1]
    assert socket_unit["Socket"]["Service"] == "fhmon.service"
    assert socket_unit["Socket"]["Accept"] == "no"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    stub = tmp_path / "fhmon"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "fhmon.service"
    unit.write_text(SERVICE_UNIT.read_text().replace(f"{SYSTEMD_PREFIX}/bin/fhmon", str(stub)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    # Unknown or misspelt directives are only warned about.
    assert "fhmon.service" not in result.stderr, result.stderr


def test_negative_unit(unit: configparser.ConfigParser, daemonset: dict[str, Any]) -> None:
    u = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    u.optionxform = str  # type: ignore[assignment,method-assign]
    u.read_dict(unit)
    u["Service"]["CapabilityBoundingSet"] += " CAP_SYS_ADMIN"
    u["Service"]["RuntimeDirectory"] = "other"
    u["Service"]["ReadWritePaths"] = ""
    problems = check_unit(u, daemonset)
    assert any("CapabilityBoundingSet" in p for p in problems)
    assert any("RuntimeDirectory" in p for p in problems)
    assert any("read-only under ProtectSystem" in p for p in problems)


SYSTEMD_PREFIX = "/opt/fhmon"  # docs/deploy.md's venv; the unit runs its bin/fhmon


def socket_unit_config() -> configparser.ConfigParser:
    parsed = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parsed.optionxform = str  # type: ignore[assignment,method-assign]
    parsed.read_string((DEPLOY / "systemd" / "fhmon.socket").read_text())
    return parsed


def check_systemd_units(service_text: str, socket_text: str) -> list[str]:
    """The socket outlives a service stop; both units run the venv's fhmon on one path."""
    problems: list[str] = []
    unit_cfg = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit_cfg.optionxform = str  # type: ignore[assignment,method-assign]
    unit_cfg.read_string(service_text)
    sock_cfg = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    sock_cfg.optionxform = str  # type: ignore[assignment,method-assign]
    sock_cfg.read_string(socket_text)
    service, sock = unit_cfg["Service"], sock_cfg["Socket"]
    for key in ("ExecStart", "ExecStartPre"):
        binary = shlex.split(service.get(key, ""))[:1]
        if binary != [f"{SYSTEMD_PREFIX}/bin/fhmon"]:
            problems.append(f"{key} runs {binary}, not the documented venv's fhmon")
    listen = PurePosixPath(sock.get("ListenStream", ""))
    runtime = service.get("RuntimeDirectory", "")
    if runtime and listen.parent == PurePosixPath("/run") / runtime and service.get(
            "RuntimeDirectoryPreserve", "no") != "yes":
        problems.append(f"{listen} is in RuntimeDirectory=/run/{runtime}, which systemd "
                        f"removes when fhmon.service stops (RuntimeDirectoryPreserve=no)")
    argv = shlex.split(service.get("ExecStart", ""))
    if "--socket" in argv and argv[argv.index("--socket") + 1] != str(listen):
        problems.append("fhmon.socket listens elsewhere than fhmon serve --socket")
    if sock.get("Service", "fhmon.service") != "fhmon.service":
        problems.append("fhmon.socket activates another service")
    pre = shlex.split(service.get("ExecStartPre", ""))
    if pre[1:2] != ["check"]:
        problems.append("ExecStartPre does not run fhmon check")
    else:
        checked, unknown = parse_flags(pre[2:], {"--key-dir", "--socket", "--allow"})
        if unknown:
            problems.append(f"ExecStartPre check: unexpected {unknown}")
        served, _ = serve_flags(argv[1:])
        for flag in ("--key-dir", "--socket", "--allow"):
            if checked.get(flag) != served.get(flag):
                problems.append(f"ExecStartPre check {flag} {checked.get(flag)} != serve "
                                f"{served.get(flag)}")
    return problems


def test_systemd_units_agree_and_keep_the_socket() -> None:
    assert check_systemd_units(SERVICE_UNIT.read_text(),
                               (DEPLOY / "systemd" / "fhmon.socket").read_text()) == []


def test_systemd_checks_catch_a_broken_copy() -> None:
    service, sock = SERVICE_UNIT.read_text(), (DEPLOY / "systemd" / "fhmon.socket").read_text()
    assert check_systemd_units(service.replace("RuntimeDirectoryPreserve=yes\n", ""), sock)
    assert check_systemd_units(service.replace(f"{SYSTEMD_PREFIX}/bin/fhmon serve",
                                               "/usr/local/bin/fhmon serve"), sock)
    assert check_systemd_units(service, sock.replace("/run/fhmon/fhmon.sock",
                                                     "/run/other.sock"))
    assert check_systemd_units(service.replace("check --key-dir /etc/fhmon/keys",
                                               "check --key-dir /etc/other"), sock)


def test_documented_systemd_install_runs(tmp_path: Path) -> None:
    """docs/deploy.md's install block, run for real up to keygen with the system Python
    (a venv, pip from PyPI), paths moved under tmp_path; then systemd-analyze verifies the
    unit with the venv's real fhmon in ExecStart."""
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no system python3")
    block = doc_block("## Hosts without Kubernetes (systemd)")
    assert f"python3 -m venv {SYSTEMD_PREFIX}" in block
    assert not re.search(r"(?m)^pip install", block), "a system-wide pip install fails on PEP 668"
    root = tmp_path / "root"
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "target", "results"))
    lines = []
    for line in block.splitlines():
        command = line.split("  #")[0].strip()
        if not command or command.startswith(("apt-get", "systemctl", "install ")):
            continue  # packages, and the live system's systemd: not here
        for path in (SYSTEMD_PREFIX, "/usr/local/bin", "/etc/fhmon"):
            command = command.replace(path, f"{root}{path}")
        lines.append(command)
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    rust = rust_build_env()
    env = {"PATH": f"{root}/usr/local/bin:{rust.pop('CARGO_DIR')}:/usr/bin:/bin",
           "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1", **rust}
    res = subprocess.run(["bash", "-c", script], cwd=source, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    venv_fhmon = root / SYSTEMD_PREFIX.lstrip("/") / "bin" / "fhmon"
    assert venv_fhmon.exists()
    keys = list((root / "etc" / "fhmon" / "keys").glob("*.key"))
    assert len(keys) == 1 and keys[0].stat().st_mode & 0o077 == 0
    if shutil.which("systemd-analyze") is not None:
        unit = tmp_path / "fhmon.service"
        unit.write_text(SERVICE_UNIT.read_text().replace(f"{SYSTEMD_PREFIX}/bin/fhmon",
                                                         str(venv_fhmon)))
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                                text=True, timeout=120)
        assert verify.returncode == 0 and "fhmon.service" not in verify.stderr, verify.stderr
