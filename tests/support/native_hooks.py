"""The native extension's test hooks (KeyRing.cost, Plane.panic_next_calls): only a build
with the crate's cargo feature test-hooks has them, as scripts/setup.sh makes; a release
wheel (`pip install .`) does not. A test that calls one fails, naming the fix, rather than
skip where they are missing."""

from __future__ import annotations

import pytest

MISSING = ("monitor._native was built without its test hooks (the cargo feature test-hooks), "
           "as `pip install .` builds the release extension: run scripts/setup.sh, which "
           "installs it with MATURIN_PEP517_ARGS='--features pyo3/extension-module,test-hooks'")


def require_test_hooks() -> None:
    """Fail the calling test unless monitor._native has its test hooks."""
    from monitor import _native

    if not getattr(_native, "TEST_HOOKS", False):
        pytest.fail(MISSING, pytrace=False)
