"""`unsafe` Rust lives in native/src/sys/ alone: the crate denies unsafe_code (Cargo.toml and
lib.rs), lib.rs allows it on `mod sys` and nowhere else, the launcher and bench/refmon forbid
it, and no Rust file outside native/src/sys/ has an unsafe block, fn, impl or trait.

The compiler enforces the deny; what it cannot see is a second allow slipped in elsewhere,
which is what these tests catch."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
SYS = NATIVE / "src" / "sys"
LIB_RS = NATIVE / "src" / "lib.rs"
# an attribute that lifts the deny: allow, expect or warn naming unsafe_code
LIFTS_UNSAFE_DENY = re.compile(r"#!?\[\s*(?:allow|expect|warn)\s*\([^)\]]*\bunsafe_code\b")
UNSAFE_KEYWORD = re.compile(r"\bunsafe\s*(?:\{|fn\b|impl\b|trait\b|extern\b)")


def _rust_files() -> list[Path]:
    """Every Rust source of the crates that link fhmon_native, outside build output."""
    found = []
    for base in (NATIVE, ROOT / "bench" / "refmon"):
        found += [path for path in base.rglob("*.rs")
                  if "target" not in path.relative_to(base).parts]
    return sorted(found)


def _code(text: str) -> str:
    """The text without // comments (doc comments included): what the compiler reads."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def test_the_scan_sees_the_sources() -> None:
    files = _rust_files()
    assert LIB_RS in files and SYS / "mod.rs" in files and len(files) > 30


def test_the_crate_denies_unsafe_code_and_allows_it_on_mod_sys_alone() -> None:
    assert re.search(r'^unsafe_code = "deny"$', (NATIVE / "Cargo.toml").read_text(), re.M)
    lib = _code(LIB_RS.read_text())
    assert re.search(r"^#!\[deny\(unsafe_code\)\]$", lib, re.M)
    assert re.search(r"^#\[allow\(unsafe_code\)\]\s*\npub mod sys;$", lib, re.M), \
        "lib.rs must allow unsafe_code on `pub mod sys;` (the line before it)"
    lifted = [f"{path.relative_to(ROOT)}:{number}"
              for path in _rust_files()
              for number, line in enumerate(_code(path.read_text()).splitlines(), 1)
              if LIFTS_UNSAFE_DENY.search(line)]
    assert lifted == [f"native/src/lib.rs:{_line_of(LIB_RS, '#[allow(unsafe_code)]')}"], lifted


def test_the_crates_that_use_it_forbid_unsafe_code() -> None:
    for manifest in (NATIVE / "launcher" / "Cargo.toml", ROOT / "bench/refmon/Cargo.toml"):
        assert re.search(r'^unsafe_code = "forbid"$', manifest.read_text(), re.M), manifest


def test_no_unsafe_outside_native_src_sys() -> None:
    outside = [str(path.relative_to(ROOT)) for path in _rust_files()
               if SYS not in path.parents and UNSAFE_KEYWORD.search(_code(path.read_text()))]
    assert not outside, outside
    inside = [path for path in SYS.glob("*.rs") if UNSAFE_KEYWORD.search(path.read_text())]
    assert len(inside) > 5  # the pattern does find the syscall wrappers' blocks


def _line_of(path: Path, text: str) -> int:
    """The 1-based number of the first line of path that starts with text."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith(text):
            return number
    raise AssertionError(f"{text!r} not in {path}")
