"""Smoke test of the benchmark: `python -m bench.run --quick` runs end to end.

No timing assertions (machines here are shared and noisy): only that every call succeeded
(exit status 0), that the table names every configuration, and that the JSON is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("kernel", "refmon", "fhmon", "fhmon-nosign", "fhmon-nosync")


def test_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line.split() for line in proc.stdout.splitlines()]
    seen = {words[4] for words in table if len(words) > 4 and words[0] in ("n2h", "obh", "mix")}
    for config in CONFIGS:
        assert config in seen, proc.stdout
    report = json.loads(out.read_text())
    assert {r["op"] for r in report["results"]} == {"n2h", "obh", "mix"}
    assert all(not r["errors"] for r in report["results"])
    assert report["levers"]["floor"] and report["levers"]["primitives"]
