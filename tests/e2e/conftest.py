"""Fixtures of the end-to-end tests: the prepared environment, or a clear failure.

Why here: preparing the environment (downloads on a fresh machine, ~1 min) happens once per
session, and a broken environment must fail the e2e tests, never skip them; the only skip is
when QEMU cannot start at all on the machine.  Deselect them with `-m "not e2e"`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import image

from . import harness


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: end-to-end: real virtiofsd serving a QEMU guest (root, ~30 s per test)")


@pytest.fixture(scope="session")
def e2e_env() -> harness.Env:
    """The environment built by env/prepare.py (run here, idempotent) with a usable QEMU."""
    if os.geteuid() != 0:
        pytest.fail("the e2e tests must run as root (they run virtiofsd as root and as uid 65534, "
                    "and env/prepare.py installs QEMU); deselect them with -m 'not e2e'",
                    pytrace=False)
    try:
        env = harness.ensure_env()
    except (harness.E2EEnvironmentError, subprocess.TimeoutExpired) as e:
        pytest.fail(f"e2e environment broken: {e}", pytrace=False)
    try:
        harness.accelerator(env)
    except harness.QemuUnavailable as e:
        pytest.skip(f"QEMU cannot run on this machine: {e}")
    except harness.E2EEnvironmentError as e:
        pytest.fail(f"e2e environment broken: {e}", pytrace=False)
    return env


@pytest.fixture(scope="session")
def fhmon_image() -> Iterator[tuple[Path, image.ImageConfig]]:
    """fhmon's image as scripts/build-image.sh builds it (cached under build/image), unpacked:
    its root filesystem and config (the runc e2e's init container runs from it)."""
    if os.geteuid() != 0:
        pytest.fail("the image is unpacked as root (umoci keeps owners)", pytrace=False)
    with image.unpacked() as found:
        yield found
