"""The extension's test hooks stay out of a release build: each is behind the crate's cargo
feature test-hooks, which no release recipe turns on (the crate's defaults, pyproject.toml,
deploy/Containerfile), while scripts/setup.sh's development install does; the stubs say so,
and every Python caller of a hook checks that it is there.

A source check, since building a release wheel here would take minutes; the wheel itself
was inspected once by hand (`pip wheel .`: no panic_next_calls, TEST_HOOKS False)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from monitor import _native

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "native" / "src"
GATE = '#[cfg(feature = "test-hooks")]'
PLANE = [SRC / "plane.rs", *sorted((SRC / "plane").glob("*.rs"))]
# (the files, the line that starts the hook): what only tests and benchmarks call
HOOKS = [
    ([SRC / "lib.rs"], "pub mod fuzzing;"),
    ([SRC / "py" / "keyring.rs"], "fn cost("),
    ([SRC / "py" / "plane.rs"], "fn panic_next_calls("),
    (PLANE, "pub fn panic_next_calls("),
    (PLANE, "pub(super) fn panic_next_calls("),
    (PLANE, "panic_next: AtomicU64,"),
    (PLANE, "panic_next: AtomicU64::new(0),"),
    (PLANE, "fn panic_if_asked("),
]
PYTHON_HOOK_CALL = re.compile(r"\.(cost|panic_next_calls)\(")


def _attributes_above(lines: list[str], index: int) -> list[str]:
    """The attribute lines right above lines[index], past doc comments."""
    found = []
    for line in reversed(lines[:index]):
        stripped = line.strip()
        if stripped.startswith("#["):
            found.append(stripped)
        elif not stripped.startswith("///"):
            break
    return found


def test_every_hook_is_behind_the_feature() -> None:
    ungated = []
    for paths, start in HOOKS:
        seen = 0
        for path in paths:
            lines = path.read_text().splitlines()
            at = [i for i, line in enumerate(lines) if line.strip().startswith(start)]
            seen += len(at)
            ungated += [f"{path.relative_to(SRC)}:{i + 1}" for i in at
                        if GATE not in _attributes_above(lines, i)]
        assert seen, f"no line starts with {start!r} in {[p.name for p in paths]}"
    assert not ungated, f"test hooks without {GATE}: {ungated}"


def test_the_panic_check_in_a_call_is_behind_the_feature() -> None:
    """The check lives in a gated function (HOOKS); each place a call's work asks for it is
    gated too, and nothing else in the plane reads the counter."""
    calls = [(path, lines, i) for path in PLANE
             for lines in [path.read_text().splitlines()]
             for i, line in enumerate(lines) if re.search(r"\bself\.panic_if_asked\(\)", line)]
    assert calls, "no call's work asks for the panic check (self.panic_if_asked())"
    ungated = [f"{path.relative_to(SRC)}:{i + 1}" for path, lines, i in calls
               if lines[i - 1].strip() != GATE]
    assert not ungated, ungated
    readers = [f"{path.relative_to(SRC)}:{i + 1}" for path in PLANE
               for i, line in enumerate(path.read_text().splitlines())
               if re.search(r"\bself\.panic_next\.", line) and path.name != "answer.rs"]
    assert not readers, f"the panic counter read outside plane/answer.rs: {readers}"


def test_no_release_recipe_turns_the_feature_on() -> None:
    cargo = tomllib.loads((ROOT / "native" / "Cargo.toml").read_text())
    assert cargo["features"]["test-hooks"] == []
    assert "test-hooks" not in cargo["features"]["default"]
    maturin = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["maturin"]
    assert "test-hooks" not in maturin.get("features", [])
    assert not maturin.get("all-features")
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    assert not re.search(r"test-hooks|--features|--all-features|\s-F\s", containerfile)


def test_the_development_install_turns_it_on() -> None:
    """setup.sh passes --features to maturin, which then drops pyproject.toml's own list:
    setup.sh's must hold that list as well as test-hooks."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    listed = re.search(r'^dev_features="([^"]+)"$', setup, re.M)
    assert listed, "scripts/setup.sh: no dev_features line"
    features = set(listed.group(1).split(","))
    maturin = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["maturin"]
    assert features == {*maturin.get("features", []), "test-hooks"}
    assert 'MATURIN_PEP517_ARGS="${MATURIN_PEP517_ARGS:+$MATURIN_PEP517_ARGS }--features ' \
           '$dev_features"' in setup


def test_the_stubs_say_which_methods_are_hooks() -> None:
    stubs = (ROOT / "monitor" / "_native.pyi").read_text().splitlines()
    assert "TEST_HOOKS: bool" in stubs
    for name in ("cost", "panic_next_calls"):
        at = next(i for i, line in enumerate(stubs) if line.strip().startswith(f"def {name}("))
        assert "test builds only (TEST_HOOKS)" in stubs[at - 1], name


def test_the_build_here_has_the_hooks_it_says_it_has() -> None:
    assert isinstance(_native.TEST_HOOKS, bool)
    assert hasattr(_native.KeyRing, "cost") is _native.TEST_HOOKS
    assert hasattr(_native.Plane, "panic_next_calls") is _native.TEST_HOOKS


def test_every_python_caller_of_a_hook_checks_for_it() -> None:
    unchecked = []
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        text = path.read_text()
        if "_native" in text and PYTHON_HOOK_CALL.search(text) \
                and not re.search(r"require_test_hooks\(\)|_native\.TEST_HOOKS", text):
            unchecked.append(str(path.relative_to(ROOT)))
    assert not unchecked, unchecked
