"""The attempt records of the adversarial suite and the report made from them.

`Recorder` records one attempt and asserts it at once (a failed attempt fails its test);
`expected`/`observed` are errnos (0 = success) or text. When the whole suite ran, the
conftest's session hook writes `render_report()` to REPORT (build/security.md: untracked);
`python -m tests.adversarial.publish` copies it into docs/security.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.adversarial.common import CATEGORIES, errname

HERE = Path(__file__).resolve().parent
# published to docs/ by publish.py; a run against another configuration writes its own
_CONFIG = os.environ.get("FHMON_TEST_CONFIG")
REPORT = HERE.parents[1] / "build" / (f"security-{Path(_CONFIG).stem}.md" if _CONFIG
                                      else "security.md")
# RSS never shrinks back exactly (the allocator keeps freed arenas): what must not happen is
# growth with the size of an attack. 1,000 connections cost about 5 MiB once.
RSS_TOLERANCE_KIB = 8 * 1024
FD_SETTLE_SECONDS = 20.0


# --- records ------------------------------------------------------------------------------

@dataclass
class Attempt:
    category: str
    what: str
    expected: str
    observed: str
    passed: bool
    test: str
    known_bug: str = ""  # the xfail reason of the test, if it is a known bug


@dataclass
class Finding:
    test: str
    title: str
    reason: str
    fix: str


@dataclass
class SessionState:
    attempts: list[Attempt] = field(default_factory=list)
    findings: dict[str, Finding] = field(default_factory=dict)
    collected: list[str] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    outcomes: dict[str, str] = field(default_factory=dict)
    deselected: bool = False
    scenarios: int = 0
    max_rss_growth: int = 0
    max_fd_settle: float = 0.0
    started: float = field(default_factory=time.monotonic)
    world_base: str = ""  # the session's temporary tree, shown as $WORLD in the report
    first: tuple[int, int] | None = None  # the session fhmon's (fds, RSS KiB), first scenario
    last: tuple[int, int] | None = None  # ... after the last scenario


STATE = SessionState()


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return errname(value)
    return str(value)


def _summarise(values: list[Any]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[_describe(v)] = counts.get(_describe(v), 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))


class Recorder:
    """Records attempts of one test; each call asserts its attempt."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node
        marker = node.get_closest_marker("xfail")
        self.known_bug = str(marker.kwargs.get("reason", "")) if marker else ""

    def __call__(self, category: str, what: str, expected: Any, observed: Any,
                 ok: bool | None = None) -> None:
        assert category in CATEGORIES, category
        exp, obs = _describe(expected), _describe(observed)
        passed = (exp == obs) if ok is None else ok
        STATE.attempts.append(Attempt(category, what, exp, obs, passed, self.node.nodeid,
                                      self.known_bug))
        assert passed, f"[{category}] {what}: expected {exp}, observed {obs}"

    def every(self, category: str, what: str, expected: Any, observed: list[Any]) -> None:
        """Many variants of one attempt, each of which must give `expected`."""
        ok = bool(observed) and all(_describe(v) == _describe(expected) for v in observed)
        self(category, f"{what} ({len(observed)} variants)", f"{_describe(expected)} for all",
             _summarise(observed), ok=ok)


def ours(nodeid: str) -> bool:
    return nodeid.startswith("tests/adversarial/")


def whole_suite_ran() -> bool:
    files_on_disk = {f"tests/adversarial/{p.name}" for p in HERE.glob("test_*.py")}
    files_run = {nodeid.split("::")[0] for nodeid in STATE.collected}
    return (bool(STATE.collected) and files_on_disk <= files_run and not STATE.deselected
            and set(STATE.collected) <= STATE.finished)


def _cell(text: str) -> str:
    if STATE.world_base:
        text = text.replace(STATE.world_base, "$WORLD")
    return text.replace("|", "\\|").replace("\n", " ")


def render_report(seconds: float) -> str:
    attempts = sorted(STATE.attempts, key=lambda a: CATEGORIES.index(a.category))
    got_through = [a for a in attempts if not a.passed and a.known_bug]
    failed = [a for a in attempts if not a.passed and not a.known_bug]
    outcomes = STATE.outcomes
    tests_failed = sorted(n for n, o in outcomes.items() if o in ("failed", "error", "xpassed"))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Security report: the adversarial suite",
        "",
        "Generated from the attempts recorded by `tests/adversarial/`: a whole run of the "
        "suite (`bash scripts/test.sh`, or `.venv/bin/pytest tests/adversarial`) writes it "
        "to `build/security.md`, and `.venv/bin/python -m tests.adversarial.publish` copies "
        "it here; do not edit by hand. The threats, defences and residual risks behind "
        "these attempts are in `docs/threat-model.md`.",
        "",
        "Every attempt is made by a real attacker against a real fhmon on the real kernel: a "
        "target program running as uid 65534 under fhmon's filter, or a hostile client of the "
        "intake socket. Each row is asserted by its test; `expected` is the documented answer "
        "(`docs/semantics.md`, `docs/protocol.md`), `observed` is what the attacker got. "
        "`$WORLD` is the run's temporary tree: the share is `$WORLD/shares/main`, beside it "
        "`$WORLD/shares/other` (another tenant) and `$WORLD/outside` (host files of no "
        "share).",
        "",
        f"Last run: {now}, Linux {platform.release()}, {os.cpu_count()} CPUs, "
        f"{len(STATE.collected)} tests in {seconds:.0f} s.",
        "",
        "## Summary",
        "",
        f"- {len(attempts)} attempts: {len(attempts) - len(got_through) - len(failed)} refused "
        f"or answered as documented, {len(got_through)} got through (known bugs, see Findings), "
        f"{len(failed)} failed unexpectedly.",
        f"- After each of the {STATE.scenarios} scenarios a well-behaved target beside the "
        f"attacker still got correct answers, and fhmon's fd count came back to its baseline "
        f"(slowest: {STATE.max_fd_settle:.1f} s); the largest RSS growth over a scenario was "
        f"{STATE.max_rss_growth} KiB (tolerance {RSS_TOLERANCE_KIB} KiB).",
    ]
    if STATE.first and STATE.last:
        lines.append(f"- The session's fhmon from the first scenario to the last: "
                     f"{STATE.first[0]} -> {STATE.last[0]} fds, RSS "
                     f"{STATE.last[1] - STATE.first[1]:+d} KiB.")
    if tests_failed:
        lines.append(f"- Tests that failed in this run: {', '.join(tests_failed)}.")
    lines += ["", "## Findings", ""]
    if not STATE.findings:
        lines += ["Nothing got through.", ""]
    grouped: dict[str, list[Finding]] = {}
    for finding in STATE.findings.values():
        grouped.setdefault(finding.reason, []).append(finding)
    statuses = {"xfailed": "open: the attack still works (the test fails as expected)",
                "failed": "no longer reproduces (strict XPASS): remove the xfail marker",
                "xpassed": "no longer reproduces: remove the xfail marker",
                "passed": "no longer reproduces"}
    for n, (reason, group) in enumerate(grouped.items(), 1):
        tests = [f.test for f in group]
        status = "; ".join(sorted({statuses.get(outcomes.get(t, "not run"),
                                                outcomes.get(t, "not run")) for t in tests}))
        lines += [f"### {n}. {_cell(group[0].title)}", "",
                  f"- What: {_cell(reason.removeprefix('BUG: '))}.",
                  f"- Status: {status}.",
                  f"- Fix: {group[0].fix}",
                  "- Reproducer: " + ", ".join(f"`.venv/bin/pytest '{t}' --runxfail`"
                                               for t in tests), ""]
    lines += ["## Attempts", "",
              "| # | category | attempt | expected | observed | result |",
              "|---|---|---|---|---|---|"]
    for n, a in enumerate(attempts, 1):
        if a.passed:
            result = "pass"
        elif a.known_bug:
            result = "**GOT THROUGH** (known bug)"
        else:
            result = "**FAIL**"
        lines.append(f"| {n} | {a.category} | {_cell(a.what)} | {_cell(a.expected)} | "
                     f"{_cell(a.observed)} | {result} |")
    return "\n".join(lines) + "\n"
