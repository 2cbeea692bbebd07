"""No file of the project holds a merge's conflict markers (a merge once left them in
docs/architecture.md, and nothing that renders or parses a Markdown table complains)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLACES = ("README.md", "pyproject.toml", "docs", "monitor", "protocol", "native", "tests",
          "bench", "deploy", "scripts", ".ci")
SKIP = {".venv", "target", "build", "__pycache__", "_bin", ".git"}
SUFFIXES = {".md", ".py", ".pyi", ".rs", ".toml", ".sh", ".yaml", ".yml", ".json", ".txt", ""}
MARKER = re.compile(r"^(<{7}|>{7}) |^={7}$", re.MULTILINE)


def _files() -> list[Path]:
    found = []
    for place in PLACES:
        path = ROOT / place
        candidates = [path] if path.is_file() else path.rglob("*")
        for f in candidates:
            if f.is_file() and f.suffix in SUFFIXES and not SKIP & set(f.relative_to(ROOT).parts):
                found.append(f)
    return found


def test_no_file_holds_conflict_markers() -> None:
    files = _files()
    assert len(files) > 100  # the walk found the project
    marked = [str(f.relative_to(ROOT)) for f in files
              if MARKER.search(f.read_text(errors="replace"))]
    assert not marked, f"merge conflict markers in {marked}"
