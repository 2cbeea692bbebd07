"""The security report is published by an explicit step, never by the test run itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial import recording as adversarial
from tests.adversarial.publish import ROOT, publish


def test_the_run_writes_its_report_outside_the_tracked_tree() -> None:
    assert adversarial.REPORT.parent == ROOT / "build"  # ignored by .gitignore
    assert "build/" in (ROOT / ".gitignore").read_text().split()


def test_publish_copies_a_report_and_refuses_anything_else(tmp_path: Path) -> None:
    built, published = tmp_path / "built.md", tmp_path / "published.md"
    with pytest.raises(SystemExit, match="run the whole adversarial suite"):
        publish(ROOT / "build" / "no-such-report.md", published)
    built.write_text("not a report\n")
    with pytest.raises(SystemExit, match="not a security report"):
        publish(built, published)
    built.write_text("# Security report: the adversarial suite\n\nrows\n")
    publish(built, published)
    assert published.read_text() == built.read_text()
