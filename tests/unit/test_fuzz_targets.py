"""Every fuzz body has its cargo-fuzz target: each `pub fn NAME(data: &[u8])` of the crates'
fuzzing modules (the bodies the stable property loops run) is called by a file of
native/fuzz/fuzz_targets/ that native/fuzz/Cargo.toml names as a [[bin]], so that a
nightly machine's `cargo fuzz run` reaches every parser of hostile bytes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[2] / "native"
BODIES = {"fhmon_native": NATIVE / "src" / "fuzzing.rs",
          "fhmon_launch": NATIVE / "launcher" / "src" / "fuzzing.rs"}
BODY = re.compile(r"^pub fn (\w+)\(data: &\[u8\]\)", re.MULTILINE)
CALL = re.compile(r"fuzz_target!\(\|data: &\[u8\]\| (\w+)::fuzzing::(\w+)\(data\)\);")


def test_every_fuzz_body_has_a_cargo_fuzz_target() -> None:
    bodies = {(crate, name) for crate, path in BODIES.items()
              for name in BODY.findall(path.read_text())}
    assert len(bodies) >= 8  # the five of the plane's parsers and the launcher's three
    manifest = tomllib.loads((NATIVE / "fuzz" / "Cargo.toml").read_text())
    targets = {}
    for entry in manifest["bin"]:
        called = CALL.findall((NATIVE / "fuzz" / entry["path"]).read_text())
        assert len(called) == 1, f"{entry['path']}: one fuzz_target! call of a fuzzing body"
        targets[entry["name"]] = called[0]
    assert set(targets.values()) == bodies, (
        f"without a target: {sorted(bodies - set(targets.values()))}; "
        f"calling no body: {sorted(set(targets.values()) - bodies)}")
