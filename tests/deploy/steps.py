"""What the tests that run documented steps for real share: a code block of a doc, the
layout kubelet gives a Secret volume, the environment of a Rust build.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tests.deploy.checks import SECRET_DATA
from tests.deploy.render import DOCS


def secret_volume_layout(root: Path, files: dict[str, bytes], mode: int) -> None:
    """Lay out files the way kubelet's atomic writer fills a Secret volume."""
    root.mkdir()
    root.chmod(0o777)  # an emptyDir-style tmpfs root
    data = root / "..2025_01_01_00_00_00.000000001"
    data.mkdir()
    data.chmod(0o755)
    for name, content in files.items():
        (data / name).write_bytes(content)
        (data / name).chmod(mode)
        (root / name).symlink_to(f"{SECRET_DATA}/{name}")
    (root / SECRET_DATA).symlink_to(data.name)


def doc_block(after: str) -> str:
    text = DOCS.read_text()
    start = text.index(after)
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert block, f"no sh block after {after!r}"
    return block.group(1)


def rust_build_env() -> dict[str, str]:
    """What a build of fhmon needs of the caller's environment: cargo's directory on PATH
    and rustup's homes (a test that sets HOME elsewhere would hide the toolchain)."""
    cargo = shutil.which("cargo")  # the data plane's build needs the Rust toolchain (docs)
    assert cargo is not None, "building fhmon needs cargo on PATH (scripts/setup.sh checks)"
    home = Path.home()
    return {"CARGO_DIR": str(Path(cargo).parent),
            "RUSTUP_HOME": os.environ.get("RUSTUP_HOME", str(home / ".rustup")),
            "CARGO_HOME": os.environ.get("CARGO_HOME", str(home / ".cargo"))}
