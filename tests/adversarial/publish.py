"""Copy the adversarial run's report (build/security.md) into docs/security.md.

A test run never writes tracked files, so that a contributor's checkout stays clean; this
explicit step publishes the last whole run's table: `.venv/bin/python -m
tests.adversarial.publish` after `bash scripts/test.sh` (or `pytest tests/adversarial`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "build" / "security.md"
PUBLISHED = ROOT / "docs" / "security.md"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def publish(built: Path = BUILT, published: Path = PUBLISHED) -> str:
    """Copy built to published; the message says what happened (or why not)."""
    if not built.is_file():
        raise SystemExit(f"publish: no {_shown(built)}: run the whole adversarial suite "
                         "first (bash scripts/test.sh tests/adversarial)")
    text = built.read_text()
    if not text.startswith("# Security report"):
        raise SystemExit(f"publish: {_shown(built)} is not a security report")
    published.write_text(text)
    return f"publish: {_shown(built)} -> {_shown(published)}"


if __name__ == "__main__":
    print(publish())
    sys.exit(0)
