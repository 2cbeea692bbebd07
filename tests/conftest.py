"""Shared fixtures: a real fhmon service (root) and target agents (uid 65534) on the real kernel.

Nothing here mocks the kernel: fhmon runs as a separate root process, targets run under the
real seccomp filter installed by `fhmon launch`, and oracles are the same agent program
calling the kernel directly. What the fixtures are made of lives in tests/support/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from monitor.kubevirt import webhook
from tests.support import Agent, Runner, Service, World, build_world, unprivileged_runner
from tests.support.kubevirt import LIMITS, SecretVolume, Server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Root only where root is needed: the sans-IO unit tests run as any user; every other
    suite starts fhmon (root) and targets as uid 65534, so as non-root it refuses to run
    rather than fail test by test."""
    if os.geteuid() == 0:
        return
    needs_root = sorted({i.nodeid.split("::")[0] for i in items
                         if not i.nodeid.startswith("tests/unit/")})
    if needs_root:
        raise pytest.UsageError(
            "these tests need root (fhmon runs as root, its targets as uid 65534): "
            + ", ".join(needs_root[:5]) + (" ..." if len(needs_root) > 5 else "")
            + "; as another user run only tests/unit")


@pytest.fixture(scope="session")
def world() -> Iterator[World]:
    base = Path(tempfile.mkdtemp(prefix="fhmon-test-", dir="/tmp"))
    try:
        yield build_world(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def unprivileged(world: World) -> Runner:
    """The venv as it is if uid 65534 can run it; else a world-readable copy of what it needs."""
    return unprivileged_runner(world)


@pytest.fixture(scope="session")
def fhmon(world: World) -> Iterator[Service]:
    service = Service(world.base, [str(world.shares / "*")])
    try:
        yield service
    finally:
        code = service.stop()
        assert code == 0, service.log_text()[-4000:]


@pytest.fixture
def spawn(world: World, fhmon: Service) -> Iterator[Any]:
    agents: list[Agent] = []

    def make(mode: str = "fhmon", share: Path | None = None, **kw: Any) -> Agent:
        agent = Agent(world, mode, share or world.main, kw.pop("socket", fhmon.socket), **kw)
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.close()


# --- KubeVirt: the installed launcher and the admission webhook (tests/support/kubevirt.py) ---

@pytest.fixture(scope="module")
def bundle() -> Iterator[Path]:
    # Readable by other users (pytest's tmp dirs are 0700): the launcher runs as one.
    parent = Path(tempfile.mkdtemp(prefix="fhmon-bundle-", dir="/tmp"))
    parent.chmod(0o755)
    root = parent / "launcher"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "monitor.cli", "install-launcher", str(root)],
            capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "native launcher" in result.stderr, result.stderr
        yield root
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    volume = SecretVolume(tmp_path)
    volume.rotate("first")
    certificates = webhook.CertificateFiles(volume.cert, volume.key)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(webhook.serve, "127.0.0.1:0", certificates,
                                    webhook.DEFAULT_SETTINGS, LIMITS)
        yield Server(bound[0][1], volume, certificates)
        nursery.cancel_scope.cancel()
